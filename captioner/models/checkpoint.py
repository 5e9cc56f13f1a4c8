"""Checkpoints: state dicts, config and vocabulary, saved atomically, loaded with weights_only.

A checkpoint holds only tensors and plain Python data (no pickled modules or classes), so
`torch.load(path, weights_only=True)` reads it and loading can never run code; it carries its
own config and vocabulary, so loading needs no YAML. The file format is read in
`checkpoint_format`; this module writes checkpoints, loads models from them and reads a run's
whole config back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from captioner.core.config import Config, config_from_dict
from captioner.core.errors import CheckpointError, ConfigError
from captioner.models.captioner import Captioner
from captioner.models.export_format import CONFIG, is_exported, read_config
from captioner.models.checkpoint_format import (
    FORMAT_VERSION,
    checkpoint_file,
    find_default_model,
    read_checkpoint,
    write_checkpoint_file,
)

__all__ = ["FORMAT_VERSION", "checkpoint_config", "default_model", "load_captioner", "read_checkpoint", "save_checkpoint"]


def save_checkpoint(path: str | Path, model: Captioner, config: Config | None = None, **extra: Any) -> None:
    """Write model weights, the run's `config` (else the model's own sections: model, input size,
    decoding), vocabulary and `extra` (optimizer state, step, metrics ...), with a checksum
    that loading verifies. A full disk is one StorageError; the file at `path` stays as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format_version": FORMAT_VERSION,
        "model": model.state_dict(),
        "config": config.to_dict() if config is not None else model.settings(),
        "vocab": model.vocab.to_list(),
        **extra,
    }
    write_checkpoint_file(payload, path)  # atomic and checksummed: a crash or a full disk never leaves half a checkpoint at `path`


def checkpoint_config(path: str | Path) -> Config:
    """The whole config a checkpoint was trained with (its dataset, training sections), checked
    like a config file: unlike loading the model, a setting this version refuses stops here."""
    path = checkpoint_file(path)  # a run folder: its best.pt, else last.pt
    if is_exported(path):  # an export keeps the training config in its config.json
        stored = read_config(path).get("training_config")
        if not isinstance(stored, dict):
            raise CheckpointError(f"{path / CONFIG}: no training_config (exported without one); its dataset is unknown")
        return run_config(stored, path, f"{path / CONFIG} (training_config)")
    return run_config(read_checkpoint(path)["config"], path)


def run_config(stored: dict[str, Any], path: Path, source: str | None = None) -> Config:
    """A stored run config checked like a config file; one line naming `path` when this version
    refuses a setting. `source` names where in the file it was (default: the checkpoint's config)."""
    try:
        return config_from_dict(stored, source=source or f"{path} (config)")
    except ConfigError as e:
        raise CheckpointError(f"{path}: incompatible config: {e}") from None


def load_captioner(path: str | Path, device: str | torch.device = "auto") -> Captioner:
    """`Captioner.from_pretrained`: a checkpoint file, a run folder (its best.pt, else last.pt),
    an exported folder or a Hub repo id -> the model in eval mode on `device` ("auto": a CUDA GPU when there is one)."""
    return Captioner.from_pretrained(path, device)


def default_model(device: str | torch.device = "auto") -> Captioner:
    """The project's default model, run from the project folder: the export at
    runs/default_model when there is one, else the quickstart's shapes run (runs/shapes_lstm);
    one line saying what to run when neither is there (`checkpoint_format.default_model_choice`)."""
    return Captioner.from_pretrained(find_default_model(), device)
