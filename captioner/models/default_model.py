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
"""Where the project's default model lives, relative to the project folder: the best model for
real photographs (a Flickr8k captioner trained on all 6,000 training images), put there with
`captioner export runs/<best run> runs/default_model`. `captioner demo` and `captioner caption`
without a model, and `captioner.default_model()`, load it when it is there (a user's own model
wins), else the model packaged with captioner (`packaged.installed_model`), else the quickstart's
shapes run (`QUICKSTART_RUN`)."""
QUICKSTART_RUN = Path("runs/shapes_lstm")  # configs/shapes_lstm.yaml's train.out_dir: the default without an export

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DefaultModel:
    """Which model a command given none uses, and why (`default_model_choice`)."""

    path: Path  # DEFAULT_MODEL or the packaged model (exports), or QUICKSTART_RUN (a run folder, perhaps not trained yet)
    exported: bool
    reason: str  # the one line logged


def default_model_choice() -> DefaultModel:
    """The export at DEFAULT_MODEL when that folder exists (the user's own), else the model
    packaged with captioner when one is installed, else the quickstart's shapes run; the choice is
    logged. A DEFAULT_MODEL that is there but holds no readable export is an error naming the
    file: someone put a model there, and serving another model on photographs instead would look
    like a broken model, not like a fallback. So is a packaged model whose config.json is damaged."""
    folder = DEFAULT_MODEL
    if not folder.exists():
        packaged = installed_model()
        if packaged is not None:
            choice = DefaultModel(packaged, True, f"default model: {packaged.name}, packaged with captioner (no export at {folder})")
        else:
            choice = DefaultModel(QUICKSTART_RUN, False, f"default model: the shapes run {QUICKSTART_RUN} (no export at {folder}, no packaged model)")
        log.info(choice.reason)
        return choice
    if not folder.is_dir():
        raise ExportError(f"{folder}: not a folder; the default model is an exported folder (`captioner export RUN {folder}`), "
                          "or remove it to use the shapes model")
    if not is_exported(folder):  # `export` writes config.json last: an export cut short lacks it
        raise ExportError(f"{folder / CONFIG}: missing, so {folder} holds no complete export; re-run `captioner export RUN {folder}` "
                          "or remove the folder to use the shapes model")
    read_config(folder)  # a damaged config.json: its one line now, before the choice is logged
    choice = DefaultModel(folder, True, f"default model: the export at {folder}")
    log.info(choice.reason)
    return choice


def find_default_model() -> Path:
    """What to load when no model is named: `default_model_choice()`'s, which must exist (nothing
    here trains); one line saying what to run when there is no export, no packaged model and no
    trained shapes run."""
    choice = default_model_choice()
    if choice.exported or any((choice.path / name).is_file() for name in RUN_CHECKPOINTS):
        return choice.path
    raise CheckpointError(
        f"no default model here: no export at {DEFAULT_MODEL} (`captioner export runs/<best run> {DEFAULT_MODEL}`), "
        f"no model packaged with captioner, and no trained {QUICKSTART_RUN} (`captioner train configs/shapes_lstm.yaml`); "
        "run from the project folder"
    )
