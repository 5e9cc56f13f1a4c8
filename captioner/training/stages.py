"""Where a run starts: a stage's `train.init` checkpoint, or the last.pt a `--resume` continues."""

from __future__ import annotations

import logging
from pathlib import Path

from captioner.core.config_sections import Config
from captioner.core.errors import CheckpointError
from captioner.models.checkpoint import read_checkpoint

log = logging.getLogger(__name__)


def read_resume_checkpoint(config: Config) -> dict:
    """train.out_dir's last.pt, whose model section must be the config's."""
    last = Path(config.train.out_dir) / "last.pt"
    if not last.exists():
        raise CheckpointError(f"{last}: nothing to resume (no last.pt in train.out_dir)")
    checkpoint = read_checkpoint(last)
    if checkpoint["config"]["model"] != config.to_dict()["model"]:
        raise CheckpointError(f"{last}: the model section of the config differs from the checkpoint's; cannot resume")
    return checkpoint


TRAINING_CHOICES = ("model.encoder.fine_tune_blocks",)  # how a stage trains the model, not what the model is


def read_init_checkpoint(config: Config) -> dict:
    """The checkpoint `train.init` names, whose model section must be the config's, except for
    the TRAINING_CHOICES: a stage may fine-tune an encoder that the previous one kept frozen
    (a model trained on the feature store), or freeze one it fine-tuned. The weights fit either way."""
    path = config.train.init
    checkpoint = read_checkpoint(path)
    saved, current = checkpoint["config"].get("model", {}), config.to_dict()["model"]
    for dotted in TRAINING_CHOICES:
        was, now = dotted_value(saved, dotted), dotted_value(current, dotted)
        if was != now:
            log.info(
                "%s: %s is %r in the checkpoint, %r here: this stage trains as its config says", path, dotted, was, now
            )
    conflict = first_difference(saved, current, "model", skip=TRAINING_CHOICES)
    if conflict:
        raise CheckpointError(f"{path}: {conflict}; train.init needs the model section the checkpoint was trained with")
    return checkpoint


def dotted_value(section: dict, dotted: str) -> object:
    """`section`'s value at `dotted` ('model.encoder.x' in a model section), None where absent."""
    value: object = section
    for part in dotted.split(".")[1:]:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def first_difference(saved: object, current: object, key: str, skip: tuple[str, ...] = ()) -> str | None:
    """'model.x.y is A in the checkpoint but B in the config' for the first differing key not in `skip`, or None."""
    if key in skip:
        return None
    if isinstance(saved, dict) and isinstance(current, dict):
        for name in list(dict.fromkeys([*saved, *current])):
            found = first_difference(saved.get(name), current.get(name), f"{key}.{name}", skip)
            if found:
                return found
        return None
    return None if saved == current else f"{key} is {saved!r} in the checkpoint but {current!r} in the config"
