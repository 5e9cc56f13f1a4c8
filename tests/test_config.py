"""Config loading: YAML + dotted overrides, strict validation with one-line errors."""

from __future__ import annotations

import math
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import fifo_with_a_writer

from captioner.core.config import config_from_dict, leaf_fields, load_config
from captioner.core.config_sections import Config
from captioner.core.errors import CheckpointError, ConfigError

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
KEYS = leaf_fields()  # every key, walked from the dataclasses: a key added anywhere is tried here


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_configs_load(path: Path) -> None:
    config = load_config(path)
    assert config.model.decoder.type in path.stem


def test_overrides_are_typed(tmp_path: Path) -> None:
    config = load_config(None, ["train.epochs=3", "train.lr=1e-3", "data.augment=true", "data.image_root=null"])
    assert config.train.epochs == 3 and config.train.lr == 1e-3 and config.data.augment is True
    assert config.data.image_root is None


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lrr=1", r"unknown key 'train.lrr' \(did you mean 'train.lr'\?\)"),
        ("train.epochs=many", r"^command line: 'train.epochs' must be int; got 'many'$"),
        ("train.epochs=0", r"^command line: 'train.epochs' must be >= 1; got 0$"),
        ("model.decoder.type=gru", r"'model.decoder.type' must be one of lstm, transformer; got 'gru'"),
        ("model.decoder=3", r"'model.decoder' is a section"),
        ("epochs", r"expected section.key=value"),
        ("model.decoder.dropout=1.5", r"'model.decoder.dropout' must be in \[0, 1\); got 1.5"),
        ("data.dataset=karpathy", r"'data.karpathy_file' is required"),
        # out-of-range values: each stops at load with one line
        ("train.label_smoothing=1.5", r"'train.label_smoothing' must be in \[0, 1\); got 1.5$"),
        ("train.label_smoothing=1", r"'train.label_smoothing' must be in \[0, 1\); got 1.0$"),
        ("decode.length_penalty=-3", r"'decode.length_penalty' must be a finite number in \[0, 10\]; got -3$"),
        ("train.lr=.nan", r"'train.lr' must be a finite number > 0; got nan$"),
        ("train.grad_clip=.nan", r"'train.grad_clip' must be a finite number >= 0; got nan$"),
        ("train.grad_clip=.inf", r"'train.grad_clip' must be a finite number >= 0; got inf$"),
        ("train.lr=nan", r"'train.lr' must be a finite number > 0; got nan$"),  # the string form too
        ("train.device=gpu", r"'train.device' must be auto, cpu, mps, cuda or cuda:N; got 'gpu'$"),
        ("data.root=", r"'data.root' must not be empty"),
        # backbone names belong to the registry (tests/test_encoder.py): here only their form
        ("model.encoder.name=ResNet-50", r"'model.encoder.name' must be a registered name .*; got 'ResNet-50'$"),
        ("model.encoder.normalization=0.5", r"'model.encoder.normalization' must be a registered name .*; got '0.5'$"),
    ],
)
def test_bad_overrides(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "broken.yaml").write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="broken.yaml: not valid YAML"):
        load_config(tmp_path / "broken.yaml")
    (tmp_path / "typo.yaml").write_text("train:\n  epochz: 3\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: unknown key 'train.epochz' \(did you mean 'train.epochs'\?\)"):
        load_config(tmp_path / "typo.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "nan.yaml").write_text("train:\n  lr: .nan\n")
    with pytest.raises(ConfigError, match=r"^.*nan.yaml: 'train.lr' must be a finite number > 0; got nan$"):
        load_config(tmp_path / "nan.yaml")


def test_a_config_path_that_holds_no_config_text_is_one_line(tmp_path: Path) -> None:
    """A folder, a binary file (a photo given as the config) or a file far past any config's size: each is one
    line naming the file, never an IsADirectoryError, a UnicodeDecodeError or minutes in the YAML parser."""
    (tmp_path / "cfg").mkdir()
    with pytest.raises(ConfigError, match=r"^.*cfg: config file is a folder, not a file$"):
        load_config(tmp_path / "cfg")
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError,
                       match=r"^.*binary.yaml: config file is not UTF-8 text \(invalid start byte at byte 0\)$"):
        load_config(tmp_path / "binary.yaml")
    (tmp_path / "huge.yaml").write_text("# a comment\n" * 120_000 + "train:\n  epochs: 3\n")  # a config, but huge
    with pytest.raises(ConfigError,
                       match=r"^.*huge.yaml: 1.4 MB, more than the 1.0 MB a config file may take; refused$"):
        load_config(tmp_path / "huge.yaml")


@pytest.mark.parametrize("depth", [33, 990, 5000])
def test_a_config_nested_past_any_configs_depth_is_one_line(depth: int, tmp_path: Path) -> None:
    """Brackets thousands deep in a file or an override: one line naming where, never a RecursionError from the
    YAML composer; a user's anchors and aliases stay allowed."""
    value = "[" * depth + "1" + "]" * depth
    (tmp_path / "deep.yaml").write_text(f"train:\n  lr: {value}\n")
    with pytest.raises(ConfigError, match=r"^.*deep\.yaml: nested deeper than the 32 levels a config file may have; "
                                          r"refused$"):
        load_config(tmp_path / "deep.yaml")
    with pytest.raises(ConfigError, match=r"^command line's train\.lr: nested deeper than the 32 levels a config "
                                          r"value may have; refused$"):
        load_config(None, [f"train.lr={value}"])
    (tmp_path / "aliases.yaml").write_text("train:\n  lr: &rate 0.002\n  encoder_lr: *rate\n")
    assert load_config(tmp_path / "aliases.yaml").train.encoder_lr == 0.002


@pytest.mark.parametrize("value, said", [("9" * 5000, r"Exceeds the limit \(4300 digits\) for integer string "
                                                    r"conversion: value has 5000 digits"),
                                         ("2001-13-45", r"month must be in 1\.\.12")],
                         ids=["long integer", "impossible date"])
def test_a_scalar_python_cannot_convert_is_one_line(value: str, said: str, tmp_path: Path) -> None:
    """PyYAML's int() and date() raised a ValueError traceback for a file or an override."""
    (tmp_path / "odd.yaml").write_text(f"train:\n  lr: {value}\n")
    with pytest.raises(ConfigError, match=rf"^.*odd\.yaml: not valid YAML here: a value Python cannot read "
                                          rf"\({said}\)$"):
        load_config(tmp_path / "odd.yaml")
    with pytest.raises(ConfigError, match=r"^command line's train\.epochs: not valid YAML here"):
        load_config(None, [f"train.epochs={value}"])


def test_a_key_given_twice_in_a_section_is_one_line_naming_both_lines(tmp_path: Path) -> None:
    """YAML keeps the second of two equal keys without a word: a config's forgotten second `lr:` trained unseen.
    The same key in two sections, or set again through a merge (<<), is no repeat."""
    (tmp_path / "twice.yaml").write_text("train:\n  lr: 0.001\n  epochs: 3\n  lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"twice\.yaml: 'lr' is given twice in one section \(lines 2 and 4\); "
                                          r"YAML would keep the second silently$"):
        load_config(tmp_path / "twice.yaml")
    (tmp_path / "apart.yaml").write_text("train:\n  seed: 3\ndata:\n  seed: 4\n")
    with pytest.raises(ConfigError, match="unknown key 'data.seed'"):  # read whole, then judged key by key
        load_config(tmp_path / "apart.yaml")
    (tmp_path / "merged.yaml").write_text("train:\n  <<: {lr: 0.001, epochs: 3}\n  lr: 0.002\n")
    assert (load_config(tmp_path / "merged.yaml").train.lr, load_config(tmp_path / "merged.yaml").train.epochs) == (
        0.002, 3)


def test_a_config_path_that_is_a_named_pipe_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    """Reading a FIFO waits for a writer forever: it is refused as not a file (so are /dev/zero and
    other devices, which never end)."""
    with fifo_with_a_writer(tmp_path / "f.yaml") as fifo, pytest.raises(
            ConfigError, match=r"^.*f.yaml: config file is not a regular file \(a pipe, a device or a socket\)"):
        load_config(fifo)


# --- every key: a type and a range ----------------------------------------------------------------


def test_every_key_has_a_spec() -> None:
    """Declare each key as `name: T = setting(default, Range/Choice/Text/Flag)`: the spec says
    what is allowed, and this walk (and every load) refuses a key without one."""
    missing = [dotted for dotted, f, _ in KEYS if "spec" not in f.metadata]
    assert missing == [], f"config keys without a spec: {missing}"


def test_defaults_satisfy_their_specs() -> None:
    config_from_dict({}, source="defaults")  # validates every key of a default Config


def kinds(annotation: Any) -> tuple[type, ...]:
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    return tuple(a for a in args if a is not type(None))


WRONG_TYPE = {int: 2.5, float: "fast", str: [1, 2], bool: "maybe"}


def wrong_type(annotation: Any) -> Any:
    [kind] = kinds(annotation)
    return WRONG_TYPE[kind]


def out_of_range(dotted: str) -> list[tuple[str, Any]]:
    f, annotation = next((f, a) for d, f, a in KEYS if d == dotted)
    [kind] = kinds(annotation)
    cases = []
    bad = f.metadata["spec"].outside(kind)
    if bad is not None:
        cases.append(("out of range", bad))
    if kind is float:
        cases += [("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf)]
    return cases


CASES = [(dotted, "wrong type", wrong_type(annotation)) for dotted, _, annotation in KEYS]
CASES += [(dotted, label, value) for dotted, _, _ in KEYS for label, value in out_of_range(dotted)]


def test_the_walk_tries_every_key() -> None:
    """The numbers the issue note cites: every key with a wrong type, and each key that has a
    range (all but the true/false and free-text ones) with a value outside it."""
    assert {dotted for dotted, _, _ in CASES} == {dotted for dotted, _, _ in KEYS}
    ranged = {dotted for dotted, label, _ in CASES if label != "wrong type"}
    print(f"\n{len(KEYS)} keys tried with a wrong type; {len(ranged)} also out of range; {len(CASES)} cases")


def nested(dotted: str, value: Any) -> dict[str, Any]:
    for part in reversed(dotted.split(".")):
        value = {part: value}
    return value


@pytest.mark.parametrize("dotted, label, value", CASES, ids=[f"{d}-{label}" for d, label, _ in CASES])
def test_every_key_refuses_bad_values(dotted: str, label: str, value: Any, tmp_path: Path) -> None:
    """The same one line, naming the key, from each way a config arrives: an override, a YAML
    file, and a config read back from a checkpoint."""
    text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(nested(dotted, value)))
    attempts = {
        "command line": lambda: load_config(None, [f"{dotted}={text}"]),
        str(path): lambda: load_config(path),
        "ckpt.pt (config)": lambda: config_from_dict(nested(dotted, value), source="ckpt.pt (config)"),
    }
    for source, attempt in attempts.items():
        with pytest.raises(ConfigError) as caught:
            attempt()
        message = str(caught.value)
        assert "\n" not in message and message.startswith(f"{source}: {dotted!r} must "), message
        assert "got " in message


def test_checkpoint_configs_are_checked_like_files(tmp_path: Path) -> None:
    """A checkpoint whose stored training config holds a value no config may hold still loads for
    captioning (the model needs only its spec), while `checkpoint_config`, which hands back the
    whole run config, refuses it in one line. A bad value in the model's spec stops the load too."""
    import torch
    from helpers import tiny_model

    from captioner.core.config import config_from_dict
    from captioner.models.checkpoint import checkpoint_config, load_captioner, save_checkpoint

    model = tiny_model()
    config = config_from_dict(model.settings())
    config.train.label_smoothing = 1.5  # set in code, past the loader's checks
    save_checkpoint(tmp_path / "bad.pt", model, config)
    loaded = load_captioner(tmp_path / "bad.pt", device="cpu")
    assert loaded.config == model.config and loaded.image_size == model.image_size
    with pytest.raises(CheckpointError, match=r"^.*bad.pt: incompatible config: "
                                              r".*'train.label_smoothing' must be in \[0, 1\); got 1.5$"):
        checkpoint_config(tmp_path / "bad.pt")
    save_checkpoint(tmp_path / "bad_decode.pt", model)
    payload = torch.load(tmp_path / "bad_decode.pt", weights_only=True)
    payload["spec"]["decode"]["max_length"] = 0  # the model's decoding defaults, as loading reads them
    torch.save(payload, tmp_path / "bad_decode.pt")
    with pytest.raises(CheckpointError, match=r"^.*bad_decode.pt: incompatible config: "
                                              r".*'decode.max_length' must be a whole number in \[1, 1000\]; got 0$"):
        load_captioner(tmp_path / "bad_decode.pt", device="cpu")


def test_a_stored_encoder_section_without_normalization_predates_it() -> None:
    """Checkpoints written before `model.encoder.normalization` existed normalised with ImageNet's
    statistics: read back, they say so, while a fresh config names the backbone's own."""
    assert load_config(None, []).model.encoder.normalization == "backbone"
    old = config_from_dict({"model": {"encoder": {"name": "efficientnet_lite0", "pretrained": True}}})
    assert old.model.encoder.normalization == "imagenet" and old.model.encoder.name == "efficientnet_lite0"
    recorded = config_from_dict({"model": {"encoder": {"name": "efficientnet_lite0", "normalization": "tf_lite"}}})
    assert recorded.model.encoder.normalization == "tf_lite"
    assert config_from_dict(
        {"model": {"encoder": {"normalization": "backbone"}}}).model.encoder.normalization == "backbone"
    # no stored encoder section: nothing to translate
    assert config_from_dict({}).model.encoder.normalization == "backbone"
    assert config_from_dict(Config().to_dict()) == Config()  # what this version writes reads back unchanged


def test_cross_field_rules() -> None:
    with pytest.raises(ConfigError,
                       match=r"'model.decoder.d_model' \(30\) must be divisible by 'model.decoder.num_heads' \(4\)"):
        load_config(None, ["model.decoder.type=transformer", "model.decoder.d_model=30", "model.decoder.num_heads=4"])
    # unused by the LSTM
    load_config(None, ["model.decoder.type=lstm", "model.decoder.d_model=30", "model.decoder.num_heads=4"])


def test_a_rule_that_ties_keys_together_names_the_source_that_broke_it(tmp_path: Path) -> None:
    """Each override is judged as it is set ("command line: ..."); a rule over several keys is judged once all
    are set, and names the command line when the config passed without the overrides, the file when it failed
    the same way without them, and both when the overrides changed a problem the file already had."""
    divisible = r"'model.decoder.d_model' \(256\) must be divisible by 'model.decoder.num_heads' \(3\)"
    with pytest.raises(ConfigError, match=rf"^command line: {divisible}"):
        load_config(None, ["model.decoder.type=transformer", "model.decoder.num_heads=3"])
    transformer = Path(__file__).resolve().parents[1] / "configs" / "shapes_transformer.yaml"
    with pytest.raises(ConfigError, match=rf"^command line: {divisible}"):
        load_config(transformer, ["model.decoder.num_heads=3"])
    (tmp_path / "both.yaml").write_text("train:\n  warmup_epochs: 1\n  warmup_steps: 100\n")
    with pytest.raises(ConfigError, match=r"^\S*both.yaml: 'train.warmup_epochs' \(1\) and 'train.warmup_steps'"):
        load_config(tmp_path / "both.yaml", ["train.lr=0.1"])  # not the command line's doing
    with pytest.raises(ConfigError,
                       match=r"^\S*both.yaml with the command line's overrides: 'train.warmup_epochs' \(2\)"):
        load_config(tmp_path / "both.yaml", ["train.warmup_epochs=2"])


def test_a_key_without_a_spec_stops_every_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a branch that adds `new_key: int = 3` (no spec) meets: a clear programming error."""
    import dataclasses

    from captioner.core import config as config_module
    from captioner.core.config_sections import DecodeConfig

    @dataclasses.dataclass
    class Decode(DecodeConfig):
        new_key: int = 3

    @dataclasses.dataclass
    class WithNewKey(Config):
        decode: Decode = dataclasses.field(default_factory=Decode)

    monkeypatch.setattr(config_module, "Config", WithNewKey)
    with pytest.raises(TypeError, match=r"config key 'decode.new_key' has no spec"):
        load_config(None, [])
