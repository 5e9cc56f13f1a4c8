"""The sections of a run's config (data, model, train, scst, decode): one dataclass each, every key
declared with `setting(default, spec)`, its type the annotation and its meaning the comment on it."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from captioner.core.decode_schema import OPTIONS as DECODE_OPTIONS
from captioner.core.decode_schema import DecodeOption
from captioner.core.decoder_types import default_decoder, section
from captioner.core.specs import Choice, Flag, Place, Range, Spec, Text


def setting(default: Any, spec: Spec | DecodeOption) -> Any:
    """Declare a config key with its default and allowed values; `validate` refuses a key without a spec."""
    return field(default=default, metadata={"spec": spec})


def key_spec(section: type, name: str) -> Spec | DecodeOption:
    """What key `name` of a section (a dataclass such as DataConfig) allows: the bounds a command's option that
    stands for the key keeps, so the two never drift apart."""
    return next(f.metadata["spec"] for f in dataclasses.fields(section) if f.name == name)


def decode_setting(name: str, default: Any = None) -> Any:
    """A key holding a decoding option: its spec (and default, unless given) from core/decode_schema.py."""
    option = DECODE_OPTIONS[name]
    return setting(option.default if default is None else default, option)


POSITIVE = Range(ge=1)  # counts and sizes
COUNT = Range(ge=0)  # counts where 0 means none/off
PROBABILITY_BELOW_ONE = Range(ge=0, lt=1)  # dropout, label smoothing: 1 would remove all signal
# Images in one split of the shapes world, at most (data.shapes_num_*, `data shapes --num-*`): 60 times the default
# train split and twice COCO's. At 128 px a JPEG image and its annotations take about 9.4 KB on disk and 8 KB of
# memory while its split is written whole, so a split of 250,000 is about 2.4 GB of files (PNG: 9 GB) and 2 GB of
# memory; a typo of 10,000,000 would be hours of drawing and 80 GB of memory.
SHAPES_MOST_IMAGES = 250_000
# Pixels a shapes world draws at most, its three splits together (images x data.image_size squared): the largest
# world at the default 128 pixels, three splits of SHAPES_MOST_IMAGES, about 6 GB of JPEG files (PNG: 27 GB). The
# count alone lets 250,000 images a split through at 4,096 pixels: 12.6 trillion pixels, terabytes of files.
SHAPES_MOST_PIXELS = 3 * SHAPES_MOST_IMAGES * 128**2
# data.image_size of a shapes config at least, pixels a side: below it a small shape is 3 to 6 pixels across, so a
# star, a diamond and a square draw as the same blot, and at 16 a scene of three takes dozens of times the draws to fit.
SHAPES_MIN_IMAGE_SIZE = 32
# train.threads at most: generous for any machine's cores (a config travels between machines), refusing a typo's
# extra digits
MAX_THREADS = 1024


def thread_count(text: str) -> int:
    """argparse type of a --threads option (the ONNX runtime's, the benchmarks'): a whole number in [1, MAX_THREADS]
    (onnxruntime starts every thread it is given at load: a million would hang the command)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be a whole number in [1, {MAX_THREADS}], got {value}")
    return value


@dataclass
class DataConfig:
    # the caption files' layout: shapes (generated), coco (2014/2017 annotations), karpathy (dataset_*.json), flickr8k,
    # imagefolder (images + metadata.jsonl/csv), hf (a Hugging Face dataset on disk), webdataset (shards, streamed)
    dataset: str = setting("shapes",
                           Choice(("shapes", "coco", "karpathy", "flickr8k", "imagefolder", "hf", "webdataset")))
    # shapes: generator output; coco: folder with annotations/; flickr8k: caption files; imagefolder: the folder;
    # hf: save_to_disk folder or Parquet files
    root: str = setting("data/shapes", Place(travels="name"))
    # folder of the images when it is not `root` (flickr8k, karpathy); hf: the folder its image paths are inside
    image_root: str | None = setting(None, Place())
    # dataset_*.json with Karpathy's splits (dataset: karpathy)
    karpathy_file: str | None = setting(None, Place(travels="name"))
    year: int = setting(2014, Choice((2014, 2017)))  # coco
    # imagefolder, hf: the column holding each image's caption (a string, or a list of them)
    caption_column: str = setting("text", Text())
    # hf: the column holding the image (an Image feature, bytes or a file path)
    image_column: str = setting("image", Text())
    # webdataset: brace patterns of shards (paths, http(s) URLs, pipe: commands), img2dataset's layout;
    # the train shards are streamed, val and test read into memory (captioner/data/streaming.py).
    train_shards: str | None = setting(  # webdataset: e.g. https://host/cc3m/{00000..00331}.tar
        None, Place(travels="name")
    )
    # webdataset: the validation shards (best.pt is picked on them)
    val_shards: str | None = setting(None, Place(travels="name"))
    # webdataset: the test shards (captioner evaluate --split test)
    test_shards: str | None = setting(None, Place(travels="name"))
    # webdataset: samples each loader worker shuffles among (1: shard order)
    shuffle_buffer: int = setting(1000, POSITIVE)
    # webdataset: broken samples (bad image, no caption) skipped per worker before the run stops
    max_broken_fraction: float = setting(0.01, Range(ge=0, lt=1))
    # webdataset: what one shard, and a split held in memory, may take. Past a limit the read stops
    # with one line naming the shard, the member and the key (captioner/data/bounded_tar.py).

    # webdataset: a shard member (an image, a caption file) larger than this stops the read
    max_member_bytes: int = setting(32 * 2**20, POSITIVE)
    # webdataset: a shard's bytes once decompressed; more stops the read (an endless stream)
    max_shard_bytes: int = setting(8 * 2**30, POSITIVE)
    # webdataset: a compressed shard's decompressed bytes per byte read, past its first 16 MiB (a bomb)
    max_shard_expansion: float = setting(20.0, Range(ge=1))
    # webdataset: samples a validation or test split holds in memory
    max_split_samples: int = setting(100_000, POSITIVE)
    # webdataset: bytes (images and captions) a validation or test split holds in memory
    max_split_bytes: int = setting(4 * 2**30, POSITIVE)
    # webdataset: a shards.json or <shard>_stats.json larger than this is refused
    max_index_bytes: int = setting(64 * 2**20, POSITIVE)
    # imagefolder and hf without train/validation/test splits: a seeded split of the images, the
    # same for the same images and seed, written to <train.out_dir>/splits.json by training.

    # imagefolder, hf without splits: share of images held out for validation
    val_fraction: float = setting(0.05, Range(ge=0, lt=1))
    # imagefolder, hf without splits: share of images held out for testing
    test_fraction: float = setting(0.05, Range(ge=0, lt=1))
    split_seed: int = setting(0, Range(ge=0, lt=2**32))  # imagefolder, hf without splits: seed of the held-out draw
    # images are resized to a square of this side (16: the CNN's stride)
    image_size: int = setting(128, Range(ge=16, le=4096))
    min_word_count: int = setting(1, POSITIVE)  # words seen fewer times in the train captions become <unk>
    max_caption_length: int = setting(30, POSITIVE)  # words; longer captions are truncated
    # one: a random caption per image per epoch | all: every pair
    captions_per_image: str = setting("one", Choice(("one", "all")))
    augment: bool = setting(False, Flag())  # train-time crop and brightness/contrast jitter (never flips)
    strict: bool = setting(False, Flag())  # stop on any image listed in the captions but missing on disk
    # stop when more of a split's listed images than this are missing (1: train on what is there)
    max_missing_fraction: float = setting(0.05, Range(ge=0, le=1))
    # images per step and per process (each with its captions: captions_per_image)
    batch_size: int = setting(64, POSITIVE)
    # DataLoader workers per rank; -1: auto, from the cores and the ranks per node
    num_workers: int = setting(0, Range(ge=-1, le=256))
    # training on CUDA: the GPU crops, resizes, jitters (transform) and decodes JPEGs (decode, nvjpeg)
    device_preprocess: str = setting("none", Choice(("none", "transform", "decode")))
    # Frozen encoder, no augmentation: the fp16 feature store (captioner/data/store_format.py) is read
    # instead of the images; built there first when absent. null: <train.out_dir>/features.
    feature_store: str | None = setting(None, Place(allowed="a folder, or null for <train.out_dir>/features"))
    features_on_device: bool = setting(False, Flag())  # load the whole store onto the training device when it fits
    # The shapes world is generated into `root` when it is not there yet.
    shapes_num_train: int = setting(4000, Range(ge=1, le=SHAPES_MOST_IMAGES))
    shapes_num_val: int = setting(250, Range(ge=0, le=SHAPES_MOST_IMAGES))  # shapes: val images generated
    shapes_num_test: int = setting(500, Range(ge=0, le=SHAPES_MOST_IMAGES))  # shapes: test images generated
    shapes_seed: int = setting(0, Range(ge=0, lt=2**32))  # numpy's seed range


# Backbones and their pixel statistics are registered in captioner.models.encoders (the one
# list of them; core may not import models): here a name need only look like one, and the
# registry refuses an unknown one in one line when the model is built or the config checked.
REGISTERED_NAME = Text(r"[a-z][a-z0-9_]*", "a registered name (lower case, digits, _; see docs/encoders.md)")


@dataclass
class EncoderConfig:
    # small_cnn, resnet50/101/152, efficientnet_lite0/1/2 (captioner.models.encoders)
    name: str = setting("small_cnn", REGISTERED_NAME)
    pretrained: bool = setting(False, Flag())  # ImageNet weights (torchvision API; lite0 from its package, offline)
    # Pixel statistics of the on-device normalisation: backbone (the registry entry's own), imagenet
    # or tf_lite. A checkpoint written before this key existed normalised with imagenet
    # (config_from_dict fills that in), so it keeps the input it was trained on.
    normalization: str = setting("backbone", REGISTERED_NAME)
    # adaptive-pool the feature map to grid_size x grid_size; 0 keeps it
    grid_size: int = setting(0, Range(ge=0, le=64))
    # pretrained backbones: train the top N blocks (0 = frozen, -1 = all)
    fine_tune_blocks: int = setting(0, Range(ge=-1))
    width: int = setting(32, POSITIVE)  # small_cnn: channels of the first block (doubled at each of 4 blocks)


@dataclass
class ModelConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: Any = field(default_factory=default_decoder, metadata={"decoder": True})  # a registered decoder's config
    blind: bool = setting(False, Flag())  # zero the image features: a language-model baseline


@dataclass
class TrainConfig:
    # checkpoints, metrics.csv, TensorBoard logs and figures
    out_dir: str = setting("runs/shapes_lstm", Place(travels="name"))
    epochs: int = setting(20, POSITIVE)  # passes over the training split
    lr: float = setting(4e-4, Range(gt=0))  # decoder
    encoder_lr: float = setting(1e-4, Range(ge=0))  # fine-tuned layers of a pretrained encoder (from scratch: lr)
    weight_decay: float = setting(0.0, Range(ge=0))  # AdamW's weight decay
    grad_clip: float = setting(5.0, Range(ge=0))  # max gradient norm; 0: no clipping
    attention_penalty: float = setting(1.0, Range(ge=0))  # lambda of the doubly stochastic regulariser (lstm)
    label_smoothing: float = setting(0.0, PROBABILITY_BELOW_ONE)  # cross-entropy label smoothing
    # after the warmup: cosine to 5% of the peak at the last step, or constant
    schedule: str = setting("cosine", Choice(("cosine", "constant")))
    # Linear warmup, in epochs (converted through the steps per epoch at the run's world size, so
    # it means the same on 1 and 8 GPUs) or in optimiser steps; set one. Neither: 100 steps.
    warmup_epochs: float | None = setting(None, Range(ge=0))
    warmup_steps: int | None = setting(None, COUNT)  # linear warmup in optimiser steps (see warmup_epochs)
    # The learning rates (lr, encoder_lr) are used as written (none), or scaled by the global
    # batch (data.batch_size x processes) over base_batch: linearly (Goyal et al. 2017) or by its square root.
    lr_scaling: str = setting("none", Choice(("none", "linear", "sqrt")))
    # the global batch the lrs were tuned at; null: data.batch_size (one process)
    base_batch: int | None = setting(None, POSITIVE)
    # auto: a CUDA GPU when there is one, else the CPU
    device: str = setting("auto", Text(r"auto|cpu|mps|cuda(:\d+)?", "auto, cpu, mps, cuda or cuda:N"))
    amp: bool = setting(True, Flag())  # bf16 autocast on CUDA (ignored on CPU)
    # The precision of a CPU run's steps, decided before the first one and kept by --resume
    # (training/speed.py): fp32 | bf16 (autocast, native or emulated) | auto (bf16 where the
    # CPU has native bf16 and a calibration on the run's shapes, kept per machine, times it faster).
    cpu_amp: str = setting("fp32", Choice(("fp32", "auto", "bf16")))
    seed: int = setting(0, Range(ge=0, lt=2**32))  # numpy's seed range
    # steps between loss read-backs from the device (TensorBoard, progress); 0: per epoch
    log_every: int = setting(50, COUNT)
    # also write last.pt every N steps, mid-epoch (resumes at that batch); 0: per epoch
    checkpoint_every_steps: int = setting(0, COUNT)
    early_stopping_patience: int = setting(5, COUNT)  # epochs without a better validation score; 0 disables
    val_max_images: int = setting(500, COUNT)  # validation decodes this many val images (0 = all)
    # validation score that picks best.pt and drives early stopping
    val_metric: str = setting("Bleu_4", Choice(("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr")))
    # validation decodes greedily (1, as the field logs it) or with this beam
    val_beam_size: int = decode_setting("beam_size", 1)
    # also validate every N steps, mid-epoch (best.pt may come from inside an epoch); 0: at each epoch's end
    val_every_steps: int = setting(0, COUNT)
    # no augmentation: what the encoder's frozen blocks make is stored once (the feature store); only the blocks that
    # train run per step
    cache_features: bool = setting(True, Flag())
    time_limit_minutes: float = setting(0.0, Range(ge=0))  # stop after the epoch that crosses this budget (0 = none)
    # torch CPU threads for this run, fixed from its first step; 0: $CAPTIONER_THREADS, else torchrun's share, else
    # every usable core (kept by --resume). More than the cores the run may use: a warning, never a quiet change
    threads: int = setting(0, Range(ge=0, le=MAX_THREADS))
    # CPU: change the thread count mid-run as other processes take or free cores (faster on a shared machine; no longer
    # bit-exact on resume)
    follow_free_cores: bool = setting(False, Flag())
    # CUDA: NHWC images and encoder weights (faster convolutions); ignored on CPU
    channels_last: bool = setting(False, Flag())
    compile: bool = setting(False, Flag())  # CUDA: torch.compile the decoder; ignored on CPU
    # torchrun: a collective waiting longer than this fails the run
    dist_timeout_minutes: float = setting(30.0, Range(gt=0))
    # xe: cross-entropy (teacher forcing) | scst: self-critical, from train.init
    stage: str = setting("xe", Choice(("xe", "scst")))
    # start from this checkpoint's model, vocabulary and encoder; optimiser and schedule fresh
    init: str | None = setting(None, Place(travels="run"))


@dataclass
class ScstConfig:
    """Self-critical sequence training (train.stage: scst): Rennie et al. 2017, Luo 2020."""

    samples: int = setting(5, POSITIVE)  # captions sampled per image
    temperature: float = decode_setting("temperature")  # sampling temperature (log-probabilities stay the model's own)
    # sample each word among the k most probable only (0: all); as self-critical.pytorch's sample_method top<k>
    top_k: int = decode_setting("top_k")
    top_p: float = decode_setting("top_p")  # sample each word from the nucleus of this probability mass only (1: all)
    max_length: int = decode_setting("max_length", 20)  # words per sampled (and greedy-baseline) caption
    # greedy: the greedy caption's reward | mean: the image's other samples' mean reward
    baseline: str = setting("greedy", Choice(("greedy", "mean")))
    cider_weight: float = setting(1.0, Range(ge=0))  # reward = cider_weight * CIDEr-D + bleu_weight * BLEU-4
    bleu_weight: float = setting(0.0, Range(ge=0))  # see cider_weight
    # + this x the cross-entropy stage's loss on the batch's reference captions (0: pure SCST)
    xent_weight: float = setting(0.0, Range(ge=0))
    # sample with the decoder's dropout on, as in training (self-critical.pytorch); false: the test-time decoder
    dropout: bool = setting(True, Flag())
    # samples and greedy baseline never end on "a", "with", "of", ... (text/vocab.py)
    suppress_bad_endings: bool = setting(False, Flag())


@dataclass
class DecodeConfig:
    """How a model decodes by default: the options of core/decode_schema.py that a config holds
    (their limits and meaning are declared there, once) and the inference batch."""

    beam_size: int = decode_setting("beam_size")
    max_length: int = decode_setting("max_length")
    length_penalty: float = decode_setting("length_penalty")
    batch_size: int = setting(32, POSITIVE)  # images decoded together
    # CUDA: decode with the decoder step replayed as a CUDA graph (models/decoder.py, GraphedStep); ignored elsewhere
    cuda_graphs: bool = setting(False, Flag())
    block_trigrams: bool = decode_setting("block_trigrams")
    diverse_groups: int = decode_setting("diverse_groups")
    diversity_strength: float = decode_setting("diversity_strength")
    min_length: int = decode_setting("min_length")
    suppress_bad_endings: bool = decode_setting("suppress_bad_endings")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    scst: ScstConfig = field(default_factory=ScstConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def to_dict(self) -> dict[str, Any]:
        raw = dataclasses.asdict(self)
        raw["model"]["decoder"] = section(self.model.decoder)  # its type first
        return raw
