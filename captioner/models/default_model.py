"""Which model a command given none uses: the user's export at runs/default_model, else the
model packaged with captioner, else the quickstart's shapes run; the choice is logged."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from captioner.core.errors import CheckpointError, ExportError
from captioner.models.export_format import CONFIG, is_exported, read_config
from captioner.models.model_paths import RUN_CHECKPOINTS
from captioner.models.packaged import installed_model

DEFAULT_MODEL = Path("runs/default_model")
"""The user's best model for photographs, relative to the project folder
(`captioner export runs/<best run> runs/default_model`); it wins over the packaged one."""
QUICKSTART_RUN = Path("runs/shapes_lstm")  # configs/shapes_lstm.yaml's train.out_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DefaultModel:
    """Which model a command given none uses, and why (`default_model_choice`)."""

    path: Path  # DEFAULT_MODEL or the packaged model (exports), or QUICKSTART_RUN (perhaps not trained yet)
    exported: bool
    reason: str  # the one line logged


def default_model_choice() -> DefaultModel:
    """The export at DEFAULT_MODEL if that folder exists, else the packaged model, else the shapes run;
    logged. A DEFAULT_MODEL without a readable export is an error, not a silent fallback."""
    folder = DEFAULT_MODEL
    if not folder.exists():
        packaged = installed_model()
        if packaged is not None:
            choice = DefaultModel(
                packaged, True, f"default model: {packaged.name}, packaged with captioner (no export at {folder})"
            )
        else:
            choice = DefaultModel(
                QUICKSTART_RUN, False,
                f"default model: the shapes run {QUICKSTART_RUN} (no export at {folder}, no packaged model)",
            )
        log.info(choice.reason)
        return choice
    if not folder.is_dir():
        raise ExportError(f"{folder}: not a folder; the default model is an exported folder "
                          f"(`captioner export RUN {folder}`), or remove it to use the shapes model")
    if not is_exported(folder):  # `export` writes config.json last: an export cut short lacks it
        raise ExportError(f"{folder / CONFIG}: missing, so {folder} holds no complete export; "
                          f"re-run `captioner export RUN {folder}` or remove the folder to use the shapes model")
    read_config(folder)  # a damaged config.json: its one line now, before the choice is logged
    choice = DefaultModel(folder, True, f"default model: the export at {folder}")
    log.info(choice.reason)
    return choice


def find_default_model() -> Path:
    """What to load when no model is named: `default_model_choice()`'s, which must exist; else one
    line saying what to run."""
    choice = default_model_choice()
    if choice.exported or any((choice.path / name).is_file() for name in RUN_CHECKPOINTS):
        return choice.path
    raise CheckpointError(
        f"no default model here: no export at {DEFAULT_MODEL} "
        f"(`captioner export runs/<best run> {DEFAULT_MODEL}`), "
        f"no model packaged with captioner, and no trained {QUICKSTART_RUN} "
        "(`captioner train configs/shapes_lstm.yaml`); "
        "run from the project folder"
    )
