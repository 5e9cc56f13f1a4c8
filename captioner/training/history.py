"""A run's history files, read without torch (scripts/plot_runs.py, the curves, scripts/run_state.py): metrics.csv,
a row per validation, step_losses.csv, the training loss at every logged step, and finished.json, written when the
training ends as its config says."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from pathlib import Path

from captioner.core.files import write_atomically

METRICS = "metrics.csv"
STEP_LOSSES = "step_losses.csv"
# Written when the training ends as its config says (its epochs done, early stopping, the time limit), not when a
# signal or an error stops it; removed when a run starts training into the folder, a resumed one included.
FINISHED = "finished.json"


def write_csv(path: Path, header: list[str], rows: Iterable[list]) -> None:
    """`rows` under `header`, replaced atomically: a full disk leaves the previous file whole (one StorageError)."""
    text = io.StringIO()
    csv.writer(text).writerows([header, *rows])
    write_atomically(path, lambda tmp: tmp.write_text(text.getvalue(), newline=""))


def write_history(path: Path, history: list[dict]) -> None:
    """A row per validation, under every key any row has (blank where a row lacks one)."""
    keys = list(dict.fromkeys(k for row in history for k in row))
    write_csv(path, keys, [[row.get(k, "") for k in keys] for row in history])


def read_history(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    for row in rows:
        row["epoch"], row["step"] = int(row["epoch"]), int(row["step"])
    return rows


def epochs_trained(row: dict) -> float:
    """Where a history row sits on an epoch axis: mid-epoch validations (train.val_every_steps)
    at their fraction, `epochs_done`; the others at their epoch."""
    return row.get("epochs_done", row["epoch"])


def write_step_losses(path: Path, step_losses: list[list]) -> None:
    """[step, mean loss since the previous log] pairs, as the training loop logs them."""
    write_csv(path, ["step", "loss"], step_losses)


def read_step_losses(path: Path) -> list[tuple[int, float]]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [(int(row["step"]), float(row["loss"])) for row in csv.DictReader(f)]


def write_finished(out_dir: Path, where: dict[str, int]) -> None:
    """The run's training finished: `where` it ended (epoch, step, best_epoch, best_step), atomically."""
    text = json.dumps(where, indent=1) + "\n"
    write_atomically(out_dir / FINISHED, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def clear_finished(out_dir: Path) -> None:
    """An earlier end's finished.json removed: a run training into the folder has not finished until it returns."""
    (out_dir / FINISHED).unlink(missing_ok=True)


def training_finished(out_dir: str | Path) -> bool:
    """Whether the training of the run in `out_dir` finished (its finished.json), rather than stopped short."""
    return (Path(out_dir) / FINISHED).is_file()
