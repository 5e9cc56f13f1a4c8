"""Config loading: YAML + dotted overrides, strict validation with one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from captioner.config import load_config
from captioner.errors import ConfigError

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


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
        ("train.epochs=many", r"'train.epochs' must be int, got 'many'"),
        ("train.epochs=0", r"'train.epochs' must be > 0"),
        ("model.decoder.type=gru", r"'model.decoder.type' must be one of lstm, transformer; got 'gru'"),
        ("model.decoder=3", r"'model.decoder' is a section"),
        ("epochs", r"expected section.key=value"),
        ("model.decoder.dropout=1.5", r"dropout' must be in \[0, 1\)"),
        ("data.dataset=karpathy", r"'data.karpathy_file' is required"),
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
