"""Checkpoints: state dicts, config and vocabulary, saved atomically, loaded with weights_only.

A checkpoint holds only tensors and plain Python data (no pickled modules or classes), so
`torch.load(path, weights_only=True)` reads it and loading can never run code; it carries its
own config and vocabulary, so loading needs no YAML.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from captioner.core.config import Config, config_from_dict
from captioner.core.errors import CheckpointError, ConfigError
from captioner.models.build import build_model
from captioner.models.captioner import Captioner
from captioner.text.vocab import Vocabulary

FORMAT_VERSION = 1


def save_checkpoint(path: str | Path, model: Captioner, config: Config | None = None, **extra: Any) -> None:
    """Write model weights, the run's `config` (else the model's own sections: model, input size,
    decoding), vocabulary and `extra` (optimizer state, step, metrics ...)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format_version": FORMAT_VERSION,
        "model": model.state_dict(),
        "config": config.to_dict() if config is not None else model.settings(),
        "vocab": model.vocab.to_list(),
        **extra,
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: a crash mid-write never leaves a half checkpoint at `path`


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: not a readable captioner checkpoint ({first[:200]})") from None
    if not isinstance(payload, dict) or not {"model", "config", "vocab"} <= payload.keys():
        raise CheckpointError(f"{path}: not a captioner checkpoint (it lacks model, config or vocab)")
    version = payload.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {version} is not supported (this version reads {FORMAT_VERSION})")
    return payload


def checkpoint_config(path: str | Path) -> Config:
    """The whole config a checkpoint was trained with (its dataset, training sections), checked
    like a config file."""
    payload = read_checkpoint(path)
    try:
        return config_from_dict(payload["config"], source=f"{path} (config)")
    except ConfigError as e:
        raise CheckpointError(f"{path}: incompatible config: {e}") from None


def load_captioner(path: str | Path, device: str | torch.device = "cpu") -> Captioner:
    """Rebuild a model from a checkpoint; no ImageNet weights are fetched (the checkpoint has them)."""
    payload = read_checkpoint(path)
    try:
        config = config_from_dict(payload["config"], source=f"{path} (config)")
    except ConfigError as e:
        raise CheckpointError(f"{path}: incompatible config: {e}") from None
    model = build_model(config, Vocabulary(payload["vocab"]), load_pretrained=False)  # weights come from the checkpoint
    try:
        missing, unexpected = model.load_state_dict(payload["model"], strict=False)
    except RuntimeError as e:  # shape mismatches
        raise CheckpointError(f"{path}: weights do not fit the model its config describes ({str(e).splitlines()[1].strip()[:200]})") from None
    if missing or unexpected:
        names = (missing + unexpected)[:3]
        raise CheckpointError(
            f"{path}: weights do not match the model its config describes "
            f"({len(missing)} missing, {len(unexpected)} unexpected, e.g. {', '.join(names)})"
        )
    return model.to(device).eval()
