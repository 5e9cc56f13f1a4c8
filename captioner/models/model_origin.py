"""What a loaded model is, for whoever reads its captions: its name, training data and test scores,
logged once per process. A shapes-world model handed a photograph says so once and names the model
to use instead: a fluent caption of the wrong world would otherwise pass for an answer."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from captioner.core.bounded_files import read_scores_json
from captioner.core.errors import CaptionerError
from captioner.data.records import is_number
from captioner.data.shapes import COLOURS
from captioner.models.model_paths import DEFAULT_MODEL, packaged_models
from captioner.models.export_format import is_exported

log = logging.getLogger(__name__)

SHOWN_SCORES = {"Bleu_4": "BLEU-4", "METEOR": "METEOR", "CIDEr": "CIDEr-D"}  # evaluate's key -> the line's name
SHAPES_PALETTE = np.array(list(COLOURS.values()), dtype=np.int16)  # (6, 3) the shapes world's object colours


@dataclass(frozen=True)
class ModelOrigin:
    """Where a loaded model came from and what it was trained on."""

    name: str  # a packaged model's name, else the path or Hub id it was loaded from
    dataset: str | None  # its training config's data.dataset; None when not recorded
    test_scores: dict[str, float] = field(default_factory=dict)  # the test split's overall scores; empty: none
    test_beam: int | None = None
    packaged: bool = False

    def describe(self) -> str:
        """One line: which model answers, its training data and test scores."""
        where = " (packaged with captioner)" if self.packaged else ""
        data = f"trained on {self.dataset}" if self.dataset else "training data not recorded"
        shown = [
            f"{label} {self.test_scores[key]:.3f}" for key, label in SHOWN_SCORES.items() if key in self.test_scores
        ]
        beam = f" (beam {self.test_beam})" if self.test_beam else ""
        scores = f"test {', '.join(shown)}{beam}" if shown else "no test scores recorded"
        return f"captioning with {self.name}{where}: {data}; {scores}"


def nested(value: Any, *keys: str) -> Any:
    """value[key][key]..., or None where a level is missing or not a mapping (a model file's data)."""
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def export_origin(name: str, config: dict[str, Any], packaged: bool) -> ModelOrigin:
    """The origin an export's config.json records: its training config's dataset, its test scores."""
    dataset = nested(config, "training_config", "data", "dataset")
    test = overall_scores(nested(config, "scores", "test", "test"))
    return ModelOrigin(name, dataset if isinstance(dataset, str) else None, *test, packaged)


def checkpoint_origin(name: str, stored_config: Any, checkpoint: Path) -> ModelOrigin:
    """The origin a checkpoint records, with the scores of the scores_test.json beside it, if any."""
    dataset = nested(stored_config, "data", "dataset")
    test = recorded_scores(checkpoint.parent / "scores_test.json")
    return ModelOrigin(name, dataset if isinstance(dataset, str) else None, *overall_scores(test))


def recorded_scores(path: Path) -> dict[str, Any] | None:
    """The scores file `path` beside a model, or None and no score claimed: where there is none (never evaluated)
    or it cannot be read (damaged, past a limit, a pipe: one warning naming it)."""
    try:
        return read_scores_json(path, CaptionerError)
    except FileNotFoundError:
        return None
    except CaptionerError as e:
        log.warning("%s; its scores are left out", e)
        return None


def overall_scores(evaluation: Any) -> tuple[dict[str, float], int | None]:
    """An evaluation's overall scores and beam width, as `captioner evaluate` writes them."""
    if not isinstance(evaluation, dict) or not isinstance(evaluation.get("overall"), dict):
        return {}, None
    scores = {k: float(v) for k, v in evaluation["overall"].items() if is_number(v)}
    beam = evaluation.get("beam_size")
    return scores, beam if isinstance(beam, int) else None


_lock = threading.Lock()
_announced: set[str] = set()  # the models whose line this process has logged
_warned: set[str] = set()  # the shapes models this process has warned about photographs


def announce(origins: Iterable[ModelOrigin | None]) -> None:
    """Log which model answers, once per model and process."""
    for origin in origins:
        if origin is not None and first_time(_announced, origin.name):
            log.info(origin.describe())


def check_picture(origins: Iterable[ModelOrigin | None], picture: Image.Image) -> None:
    """Warn once per process when a model trained on the shapes world is given a photograph."""
    for origin in origins:
        if origin is None or origin.dataset != "shapes" or origin.name in _warned:
            continue
        if looks_like_photograph(picture) and first_time(_warned, origin.name):
            log.warning(
                "%s was trained on the shapes world: it knows only coloured shapes on a grey background, "
                "and this picture looks like a photograph; for photographs use %s", origin.name, photograph_model(),
            )


def introduce(origins: Iterable[ModelOrigin | None], picture: Image.Image) -> None:
    """What an application says as it shows a model a picture: which model answers, whether it fits."""
    announce(origins)
    check_picture(origins, picture)


def first_time(seen: set[str], name: str) -> bool:
    with _lock:
        if name in seen:
            return False
        seen.add(name)
        return True


def photograph_model() -> str:
    """The model to use on photographs: the user's export at runs/default_model, else the packaged one."""
    if is_exported(DEFAULT_MODEL):
        return (f"the default model, the export at {DEFAULT_MODEL} (`captioner caption IMAGE` with no model, "
                "or captioner.default_model())")
    if packaged := packaged_models():
        return (f"the default model, {packaged[0].name} (packaged with captioner: "
                "`captioner caption IMAGE` with no model, or captioner.default_model())")
    return f"a model trained on photographs: none is installed here (`captioner export runs/<run> {DEFAULT_MODEL}`)"


def looks_like_photograph(picture: Image.Image) -> bool:
    """Whether a picture (48 px or more) is unlike the shapes world: over 3% of its pixels away from
    edges in none of its colours, or over 1% near black or near white."""
    if max(picture.size) < 48:
        return False
    thumbnail = picture.convert("RGB")
    thumbnail.thumbnail((96, 96), Image.Resampling.NEAREST)  # nearest: each pixel keeps its own colour
    image = np.asarray(thumbnail, dtype=np.int16)  # (h, w, 3)
    step = np.zeros(image.shape[:2], dtype=np.int16)  # (h, w) the largest change to a neighbour
    rows = np.abs(np.diff(image, axis=0)).max(-1)  # (h-1, w)
    columns = np.abs(np.diff(image, axis=1)).max(-1)  # (h, w-1)
    for change, before, after in ((rows, np.s_[:-1], np.s_[1:]), (columns, np.s_[:, :-1], np.s_[:, 1:])):
        step[before] = np.maximum(step[before], change)
        step[after] = np.maximum(step[after], change)
    pixels = image.reshape(-1, 3)  # (P, 3)
    away_from_edges = step.reshape(-1) < 40  # (P,)
    chroma = pixels.max(1) - pixels.min(1)  # (P,) 0 for a grey
    palette_distance = np.abs(pixels[:, None, :] - SHAPES_PALETTE[None]).max(-1).min(1)  # (P,) to the nearest
    off_palette = float(((chroma > 40) & (palette_distance > 48) & away_from_edges).mean())
    near_black = float((pixels.max(1) < 40).mean())
    near_white = float((pixels.min(1) > 235).mean())
    return off_palette > 0.03 or near_black > 0.01 or near_white > 0.01
