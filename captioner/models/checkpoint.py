"""Checkpoints: state dicts, the model spec, the run config and vocabulary, saved atomically, loaded with
weights_only (plain data: loading never runs code), a run's config as data only (`data/model_settings.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from captioner.core.config import apply_overrides, config_from_dict
from captioner.core.config_sections import Config
from captioner.core.errors import CheckpointError, ConfigError
from captioner.data.model_settings import StoredSettings, stored_settings
from captioner.models.captioner import Captioner
from captioner.models.checkpoint_format import FORMAT_VERSION, read_checkpoint, write_checkpoint_file
from captioner.models.export_format import CONFIG, is_exported, read_config
from captioner.models.model_origin import announce
from captioner.models.model_paths import checkpoint_file, find_default_model


def save_checkpoint(path: str | Path, model: Captioner, config: Config | None = None, **extra: Any) -> None:
    """Write weights, spec, the run's `config` (else the model's own sections), vocabulary and `extra`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format_version": FORMAT_VERSION,
        "model": model.state_dict(),
        "spec": model.spec().to_dict(),  # what the model is: loading reads this
        "config": config.to_dict() if config is not None else model.settings(),  # how it trained: resuming reads this
        "vocab": model.vocab.to_list(),
        **extra,
    }
    write_checkpoint_file(payload, path)  # atomic: a crash or a full disk never leaves half a checkpoint


def checkpoint_config(path: str | Path) -> Config:
    """The whole config a checkpoint was trained with, checked; shard patterns and URLs set aside."""
    path = checkpoint_file(path)  # a run folder: its best.pt, else last.pt
    return stored_settings(stored_config(path), config_source(path), keep_local_places=True).config


def model_settings(path: str | Path, data_overrides: Sequence[str] = ()) -> StoredSettings:
    """The config a model carries, as data to read its dataset with, `data_overrides` (data.KEY=VALUE)
    kept whole; shard patterns, URLs, commands and outside places set aside unless in its run folder."""
    path = checkpoint_file(path)
    config = stored_config(path)
    if data_overrides:  # where the model's data lies locally: the user's word
        apply_overrides(config, list(data_overrides), f"{path} with the command line's data overrides", only="data.")
    named = {override.partition("=")[0].strip().lstrip("-") for override in data_overrides}
    return stored_settings(config, config_source(path), keep_local_places=written_by_its_run(path, config), named=named)


def stored_config(path: Path) -> Config:
    """The run config a checkpoint file or an exported folder holds, checked, as stored."""
    if is_exported(path):  # an export keeps the training config in its config.json
        stored = read_config(path).get("training_config")
        if not isinstance(stored, dict):
            raise CheckpointError(f"{path / CONFIG}: no training_config (exported without one); its dataset is unknown")
        return run_config(stored, path)
    return run_config(read_checkpoint(path, for_inference=True)["config"], path)


def config_source(path: Path) -> str:
    return f"{path / CONFIG} (training_config)" if is_exported(path) else f"{path} (config)"


def written_by_its_run(path: Path, config: Config) -> bool:
    """Whether checkpoint file `path` lies in its run's train.out_dir, not a copy or a download."""
    if is_exported(path):
        return False
    try:
        return path.parent.resolve() == Path(config.train.out_dir).resolve()
    except (OSError, RuntimeError, ValueError):  # a loop of links, a NUL: not its run folder
        return False


def run_config(stored: dict[str, Any], path: Path) -> Config:
    """A stored run config checked like a config file; one line naming `path` for a refused setting."""
    try:
        return config_from_dict(stored, source=config_source(path))
    except ConfigError as e:
        raise CheckpointError(f"{path}: incompatible config: {e}") from None


def load_captioner(path: str | Path, device: str | torch.device = "auto") -> Captioner:
    """`Captioner.from_pretrained`: a checkpoint, run folder, export or Hub repo id -> the model."""
    return Captioner.from_pretrained(path, device)


def default_model(device: str | torch.device = "auto") -> Captioner:
    """The default model (`model_paths.find_default_model`), logging once which model it is."""
    model = Captioner.from_pretrained(find_default_model(), device)
    announce(model.origins)
    return model
