"""`captioner config show` prints the config a run would use; `captioner config keys` lists every
key with its type, default, allowed values and meaning, read from the config code."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from helpers import REPO

from captioner.apps.cli import main
from captioner.core.config import load_config
from captioner.core.config_sections import Config
from captioner.core.decoder_types import decoder_type, registered
from captioner.core.config_keys import config_keys


def all_key_names(cls: type = Config, prefix: str = "") -> list[str]:
    """Every key, walked from the dataclasses; the decoder section: its type, then every registered decoder's keys."""
    names = []
    for f in dataclasses.fields(cls):
        value = getattr(cls(), f.name)
        if f.metadata.get("decoder"):
            names.append(f"{prefix}{f.name}.type")
            for name in registered():
                names += all_key_names(decoder_type(name).config, f"{prefix}{f.name}.")
        else:
            names += all_key_names(type(value),
                                   f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else [prefix + f.name]
    return names


def test_show_prints_the_resolved_config_as_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    config = str(REPO / "configs/shapes_transformer.yaml")
    assert main(["config", "show", config, "train.epochs=3", "decode.beam_size=5"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown == load_config(config, ["train.epochs=3", "decode.beam_size=5"]).to_dict()
    assert shown["train"]["epochs"] == 3 and shown["model"]["decoder"]["type"] == "transformer"
    assert main(["config", "show", "train.lr=0.01"]) == 0  # overrides of the built-in defaults
    assert yaml.safe_load(capsys.readouterr().out)["train"]["lr"] == 0.01


def test_show_refuses_a_bad_value_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", str(REPO / "configs/shapes_lstm.yaml"), "train.epochs=many"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "train.epochs" in err and "many" in err


def test_keys_lists_every_key_with_what_it_allows_and_means(capsys: pytest.CaptureFixture[str]) -> None:
    keys = config_keys()
    assert [k.name for k in keys] == all_key_names()
    # a key declared without a comment fails here
    assert all(k.meaning and k.allowed for k in keys), [k.name for k in keys if not k.meaning]
    by_name = {k.name: k for k in keys}
    assert (by_name["model.decoder.type"].allowed == "one of lstm, transformer"
            and by_name["model.decoder.type"].default == "lstm")
    assert by_name["train.warmup_steps"].type == "int or null"
    assert by_name["decode.beam_size"].allowed == "a whole number in [1, 100]"
    assert by_name["train.lr_scaling"].meaning.startswith("The learning rates")  # the comment block above the key
    assert main(["config", "keys", "scst."]) == 0
    out = capsys.readouterr().out
    assert out.startswith("scst.samples  (int, default 5)") and "train." not in out
    assert out.count("\n    allowed: ") == len([n for n in by_name if n.startswith("scst.")])


def test_keys_refuses_a_prefix_that_names_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "keys", "trian."]) == 2
    assert "no config key starts with 'trian.'" in capsys.readouterr().err
