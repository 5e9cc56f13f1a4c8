"""What a model path means: a checkpoint file, an exported folder, a run folder (its best.pt,
else its last.pt), the name of a model packaged with captioner, or a Hub repo id."""

from __future__ import annotations

from pathlib import Path

from captioner.core.errors import CheckpointError
from captioner.models.export_format import CONFIG, is_exported
from captioner.models.hub import hub_snapshot, looks_like_repo_id
from captioner.models.packaged import packaged_model

RUN_CHECKPOINTS = ("best.pt", "last.pt")  # what a run folder is loaded from, first found first


def checkpoint_file(path: str | Path) -> Path:
    """A checkpoint file or exported folder as given; a run folder's best.pt, else last.pt; else a
    packaged model's name; else a Hub repo id ("owner/name"), fetched into the cache."""
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
    packaged = packaged_model(name)
    if packaged is not None:
        return packaged
    if looks_like_repo_id(name):
        return hub_snapshot(name)
    raise CheckpointError(f"{path}: checkpoint not found (no such file, run folder, exported folder or Hub repo id)")
