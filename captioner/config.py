"""Configuration: nested dataclasses loaded from YAML with dotted command-line overrides.

`load_config("configs/shapes_lstm.yaml", ["train.epochs=3"])` returns a validated `Config`. Unknown
keys, values of the wrong type and values outside their allowed set raise `ConfigError` with one
line naming the file and the field, so a typo never silently trains the wrong model.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from captioner.errors import ConfigError


@dataclass
class DataConfig:
    dataset: str = "shapes"  # shapes | coco | karpathy | flickr8k
    root: str = "data/shapes"  # shapes: generator output; coco: folder with annotations/; flickr8k: caption files
    image_root: str | None = None  # folder of the images when it is not `root` (flickr8k, karpathy)
    karpathy_file: str | None = None  # dataset_*.json with Karpathy's splits (dataset: karpathy)
    year: int = 2014  # coco: 2014 | 2017
    image_size: int = 128  # images are resized to a square of this side
    min_word_count: int = 1  # words seen fewer times in the train captions become <unk>
    max_caption_length: int = 30  # words; longer captions are truncated
    captions_per_image: str = "one"  # one: a random caption per image per epoch | all: every pair
    augment: bool = False  # train-time crop and brightness/contrast jitter (never flips)
    strict: bool = False  # stop on images listed in the captions but missing on disk
    batch_size: int = 64
    num_workers: int = 0
    # Frozen encoder, no augmentation: the fp16 feature store (captioner/features.py) is read
    # instead of the images; built there first when absent. null: <train.out_dir>/features.
    feature_store: str | None = None
    features_on_device: bool = False  # load the whole store onto the training device when it fits
    # The shapes world is generated into `root` when it is not there yet.
    shapes_num_train: int = 4000
    shapes_num_val: int = 250
    shapes_num_test: int = 500
    shapes_seed: int = 0


@dataclass
class EncoderConfig:
    name: str = "small_cnn"  # small_cnn | resnet50 | resnet101 | resnet152 | efficientnet_lite0
    pretrained: bool = False  # ImageNet weights (torchvision API; lite0 from its package, offline)
    grid_size: int = 0  # adaptive-pool the feature map to grid_size x grid_size; 0 keeps it
    fine_tune_blocks: int = 0  # pretrained backbones: train the top N blocks (0 = frozen, -1 = all)
    width: int = 32  # small_cnn: channels of the first block (doubled at each of 4 blocks)


@dataclass
class DecoderConfig:
    type: str = "lstm"  # lstm | transformer
    embed_dim: int = 256
    dropout: float = 0.5
    # lstm
    hidden_dim: int = 512
    attention_dim: int = 256
    # transformer
    d_model: int = 256
    num_layers: int = 2
    num_heads: int = 4
    ff_dim: int = 1024
    norm_first: bool = False  # post-norm as in Vaswani et al. (False) or pre-norm (True)
    tie_embeddings: bool = True
    grid_position_encoding: bool = True  # 2-D sinusoidal encoding of the grid cells


@dataclass
class ModelConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    blind: bool = False  # zero the image features: a language-model baseline


@dataclass
class TrainConfig:
    out_dir: str = "runs/shapes_lstm"
    epochs: int = 20
    lr: float = 4e-4  # decoder
    encoder_lr: float = 1e-4  # fine-tuned layers of a pretrained encoder (from scratch: lr)
    weight_decay: float = 0.0
    grad_clip: float = 5.0
    attention_penalty: float = 1.0  # lambda of the doubly stochastic regulariser (lstm)
    label_smoothing: float = 0.0
    schedule: str = "cosine"  # cosine | constant
    warmup_steps: int = 100
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: bool = True  # bf16 autocast on CUDA (ignored on CPU)
    seed: int = 0
    log_every: int = 50  # steps between loss read-backs from the device (TensorBoard, progress); 0: per epoch
    checkpoint_every_steps: int = 0  # also write last.pt every N steps, mid-epoch (resumes at that batch); 0: per epoch
    early_stopping_patience: int = 5  # epochs without a better validation score; 0 disables
    val_max_images: int = 500  # validation decodes this many val images (0 = all)
    val_metric: str = "Bleu_4"  # Bleu_1..4 | CIDEr
    cache_features: bool = True  # frozen encoder and no augmentation: encode each image once, into the feature store
    time_limit_minutes: float = 0.0  # stop after the epoch that crosses this budget (0 = none)
    channels_last: bool = False  # CUDA: NHWC images and encoder weights (faster convolutions); ignored on CPU
    compile: bool = False  # CUDA: torch.compile the decoder; ignored on CPU
    dist_timeout_minutes: float = 30.0  # torchrun: a collective waiting longer than this fails the run


@dataclass
class DecodeConfig:
    beam_size: int = 3
    max_length: int = 30
    length_penalty: float = 0.0  # alpha of ((5 + len) / 6) ** alpha; 0 ranks by total log-probability
    batch_size: int = 32
    block_trigrams: bool = False  # never repeat a word trigram within a caption (beam, greedy, sampling)
    diverse_groups: int = 1  # diverse beam search: groups of beam_size / groups beams (1: plain beam search)
    diversity_strength: float = 0.5  # lambda of the Hamming diversity penalty between groups


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


CHOICES = {
    "data.dataset": ("shapes", "coco", "karpathy", "flickr8k"),
    "data.year": (2014, 2017),
    "data.captions_per_image": ("one", "all"),
    "model.encoder.name": ("small_cnn", "resnet50", "resnet101", "resnet152", "efficientnet_lite0"),
    "model.decoder.type": ("lstm", "transformer"),
    "train.schedule": ("cosine", "constant"),
    "train.val_metric": ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr"),
}
POSITIVE = (
    "data.image_size",
    "data.max_caption_length",
    "data.batch_size",
    "data.min_word_count",
    "model.decoder.embed_dim",
    "model.decoder.hidden_dim",
    "model.decoder.attention_dim",
    "model.decoder.d_model",
    "model.decoder.num_layers",
    "model.decoder.num_heads",
    "model.decoder.ff_dim",
    "model.encoder.width",
    "train.epochs",
    "train.lr",
    "train.dist_timeout_minutes",
    "decode.beam_size",
    "decode.max_length",
    "decode.batch_size",
    "decode.diverse_groups",
)
NON_NEGATIVE = (
    "data.num_workers",
    "model.encoder.grid_size",
    "train.encoder_lr",
    "train.weight_decay",
    "train.grad_clip",
    "train.attention_penalty",
    "train.warmup_steps",
    "train.checkpoint_every_steps",
    "train.log_every",
    "train.early_stopping_patience",
    "train.val_max_images",
    "train.time_limit_minutes",
    "data.shapes_num_train",
    "data.shapes_num_val",
    "data.shapes_num_test",
    "decode.diversity_strength",
)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then the YAML file, then `section.key=value` overrides, then validation."""
    config = Config()
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of sections (data, model, train, decode)")
        _merge(config, raw or {}, "", source)
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {override!r}: expected section.key=value")
        key = key.strip().lstrip("-")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        _set_dotted(config, key, value, "command line")
    validate(config, source)
    return config


def config_from_dict(raw: dict[str, Any], source: str = "checkpoint") -> Config:
    config = Config()
    _merge(config, raw, "", source)
    validate(config, source)
    return config


def _merge(node: Any, raw: dict[str, Any], prefix: str, source: str) -> None:
    names = {f.name: f for f in dataclasses.fields(node)}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(f"{source}: unknown key {dotted!r}{_suggest(dotted)}")
        current = getattr(node, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {dotted!r} must be a mapping, got {value!r}")
            _merge(current, value, dotted + ".", source)
        else:
            setattr(node, key, _coerce(value, _field_type(node, key), dotted, source))


def _set_dotted(config: Config, dotted: str, value: Any, source: str) -> None:
    *parents, leaf = dotted.split(".")
    node: Any = config
    for i, part in enumerate(parents):
        if not dataclasses.is_dataclass(node) or not hasattr(node, part):
            raise ConfigError(f"{source}: unknown key {dotted!r}{_suggest(dotted)}")
        node = getattr(node, part)
    if not dataclasses.is_dataclass(node) or leaf not in {f.name for f in dataclasses.fields(node)}:
        raise ConfigError(f"{source}: unknown key {dotted!r}{_suggest(dotted)}")
    if dataclasses.is_dataclass(getattr(node, leaf)):
        raise ConfigError(f"{source}: {dotted!r} is a section; set one of its keys, e.g. {dotted}.KEY=VALUE")
    setattr(node, leaf, _coerce(value, _field_type(node, leaf), dotted, source))


def _field_type(node: Any, name: str) -> Any:
    hints = typing.get_type_hints(type(node))
    return hints[name]


def _coerce(value: Any, annotation: Any, dotted: str, source: str) -> Any:
    """Check a value against a field's annotation (int, float, str, bool, or X | None)."""
    allowed = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    if value is None:
        if type(None) in allowed:
            return None
        raise ConfigError(f"{source}: {dotted!r} must not be empty")
    for kind in allowed:
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if kind is float and isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if kind is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    names = " or ".join("null" if k is type(None) else k.__name__ for k in allowed)
    raise ConfigError(f"{source}: {dotted!r} must be {names}, got {value!r}")


def _all_keys(node: Any = None, prefix: str = "") -> list[str]:
    node = node if node is not None else Config()
    keys = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            keys += _all_keys(value, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def _suggest(dotted: str) -> str:
    match = difflib.get_close_matches(dotted, _all_keys(), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def get_dotted(config: Config, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def validate(config: Config, source: str = "config") -> None:
    for key, choices in CHOICES.items():
        value = get_dotted(config, key)
        if value not in choices:
            raise ConfigError(f"{source}: {key!r} must be one of {', '.join(map(str, choices))}; got {value!r}")
    for key in POSITIVE:
        if get_dotted(config, key) <= 0:
            raise ConfigError(f"{source}: {key!r} must be > 0, got {get_dotted(config, key)!r}")
    for key in NON_NEGATIVE:
        if get_dotted(config, key) < 0:
            raise ConfigError(f"{source}: {key!r} must be >= 0, got {get_dotted(config, key)!r}")
    if not 0.0 <= config.model.decoder.dropout < 1.0:
        raise ConfigError(f"{source}: 'model.decoder.dropout' must be in [0, 1), got {config.model.decoder.dropout}")
    decoder = config.model.decoder
    if decoder.type == "transformer" and decoder.d_model % decoder.num_heads:
        raise ConfigError(
            f"{source}: 'model.decoder.d_model' ({decoder.d_model}) must be divisible by "
            f"'model.decoder.num_heads' ({decoder.num_heads})"
        )
    if config.data.dataset == "karpathy" and not config.data.karpathy_file:
        raise ConfigError(f"{source}: 'data.karpathy_file' is required when 'data.dataset' is karpathy")
    if config.data.feature_store is not None and not config.data.feature_store.strip():
        raise ConfigError(f"{source}: 'data.feature_store' must be a folder or null, got an empty string")
    if config.decode.beam_size % config.decode.diverse_groups:
        raise ConfigError(
            f"{source}: 'decode.beam_size' ({config.decode.beam_size}) must be a multiple of "
            f"'decode.diverse_groups' ({config.decode.diverse_groups})"
        )
    if config.model.encoder.fine_tune_blocks < -1:
        raise ConfigError(f"{source}: 'model.encoder.fine_tune_blocks' must be >= -1")


def dump_config(config: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
