"""A checkpoint file: which file (or exported folder, or Hub repo) a path means, its payload read with weights_only (no code runs),
its format version, and the config sections that rebuild the model."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from captioner.core.config import Config, config_from_dict
from captioner.core.errors import CheckpointError, ConfigError
from captioner.models.export_format import CONFIG, hub_snapshot, is_exported, looks_like_repo_id

FORMAT_VERSION = 1  # of the checkpoint files `checkpoint.save_checkpoint` writes
RUN_CHECKPOINTS = ("best.pt", "last.pt")  # what a run folder is loaded from, first found first


def checkpoint_file(path: str | Path) -> Path:
    """What a model path means: a checkpoint file as given; an exported folder (its config.json:
    `export_format`) as given; a run folder's best.pt, else its last.pt; else a Hub repo id
    ("owner/name"), downloaded into the Hugging Face cache (or found there offline)."""
    name = str(path)
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        if is_exported(path):
            return path
        for candidate in RUN_CHECKPOINTS:
            if (path / candidate).is_file():
                return path / candidate
        raise CheckpointError(f"{path}: a folder without a model (no {' or '.join(RUN_CHECKPOINTS)}, no {CONFIG})")
    if looks_like_repo_id(name):
        return hub_snapshot(name)
    raise CheckpointError(f"{path}: checkpoint not found (no such file, run folder, exported folder or Hub repo id)")


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint's payload, read with weights_only (no code runs): weights, config, vocabulary
    and whatever training kept there."""
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


def model_config(stored: Any, path: str | Path) -> Config:
    """The sections of a checkpoint's config that make the model (model, data.image_size,
    decode), checked like a config file; the other sections keep their defaults, so a training
    setting this version no longer accepts does not stop a model from loading."""
    if not isinstance(stored, dict):
        raise CheckpointError(f"{path}: incompatible config: expected a mapping of sections, got {type(stored).__name__}")
    sections = {name: stored[name] for name in ("model", "decode") if name in stored}
    data = stored.get("data", {})
    if not isinstance(data, dict):
        sections["data"] = data  # refused below, naming the section
    elif "image_size" in data:
        sections["data"] = {"image_size": data["image_size"]}
    try:
        return config_from_dict(sections, source=f"{path} (config)")
    except ConfigError as e:
        raise CheckpointError(f"{path}: incompatible config: {e}") from None
