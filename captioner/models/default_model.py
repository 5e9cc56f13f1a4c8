"""Which model a command given none uses: the user's export at runs/default_model, else the
model packaged with captioner, else the quickstart's shapes run; the choice is logged."""

from __future__ import annotations

import logging
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


def find_default_model() -> Path:
    """What to load when no model is named, logged: the export at DEFAULT_MODEL if that folder exists
    (without a readable export it is an error, not a silent fallback), else the packaged model, else
    the shapes run, which must be trained; else one line saying what to run."""
    folder = DEFAULT_MODEL
    if folder.exists():
        if not folder.is_dir():
            raise ExportError(f"{folder}: not a folder; the default model is an exported folder "
                              f"(`captioner export RUN {folder}`), or remove it to use the shapes model")
        if not is_exported(folder):  # `export` writes config.json last: an export cut short lacks it
            raise ExportError(f"{folder / CONFIG}: missing, so {folder} holds no complete export; "
                              f"re-run `captioner export RUN {folder}` or remove the folder to use the shapes model")
        read_config(folder)  # a damaged config.json: its one line now, before the choice is logged
        log.info("default model: the export at %s", folder)
        return folder
    packaged = installed_model()
    if packaged is not None:
        log.info("default model: %s, packaged with captioner (no export at %s)", packaged.name, folder)
        return packaged
    log.info("default model: the shapes run %s (no export at %s, no packaged model)", QUICKSTART_RUN, folder)
    if any((QUICKSTART_RUN / name).is_file() for name in RUN_CHECKPOINTS):
        return QUICKSTART_RUN
    raise CheckpointError(
        f"no default model here: no export at {DEFAULT_MODEL} (`captioner export runs/<best run> {DEFAULT_MODEL}`), "
        f"no model packaged with captioner, and no trained {QUICKSTART_RUN} "
        "(`captioner train configs/shapes_lstm.yaml`); run from the project folder"
    )
