"""A run's history files, read without torch (scripts/plot_runs.py, the curves, scripts/run_state.py): metrics.csv,
a row per validation, step_losses.csv, the training loss at every logged step, and finished.json, written when the
training ends as its config says; and that rule (`why_training_ended`)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from pathlib import Path

from captioner.core.files import write_atomically

METRICS = "metrics.csv"
RUN_CONFIG = "config.yaml"  # the config the run last started training with (fit writes it)
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


def patience_spent(epoch: int, best_epoch: int, patience: int) -> bool:
    """Early stopping's rule at the end of epoch `epoch`: `patience` epochs (0: never) past `best_epoch`, the epoch
    of the best val score."""
    return bool(patience) and epoch - best_epoch >= patience


def why_training_ended(epoch: int, best_epoch: int, epochs: int, patience: int) -> str | None:
    """Why a run standing at the end of epoch `epoch`, its best val score in `best_epoch`, has ended as its config
    says (`epochs` all done, or early stopping's `patience` spent), in words; None while it has epochs to train.
    The time limit is no part of it: a run resumed after it gets the limit anew."""
    if epoch >= epochs:
        return f"all {epochs} epochs done"
    if patience_spent(epoch, best_epoch, patience):
        return f"early stopping: no better val score in the {epoch - best_epoch} epochs after epoch {best_epoch}"
    return None


def ended_by_its_history(out_dir: str | Path) -> str | None:
    """`why_training_ended` for the run in `out_dir` from its config.yaml and metrics.csv alone (no torch): a run
    whose last row is an epoch's end where its config ends training, in words; else None, as for any file that is
    missing or cannot be read. A run trained before finished.json was written has these. Of equal val scores (the
    history keeps 5 decimals) the latest counts as the best, so a run said to have ended has, by its last.pt too."""
    out_dir = Path(out_dir)
    if not (out_dir / METRICS).is_file():  # no validation yet: nothing more to read
        return None
    import yaml

    from captioner.core.config import config_from_dict
    from captioner.core.errors import CaptionerError

    try:
        config = config_from_dict(yaml.safe_load((out_dir / RUN_CONFIG).read_text(encoding="utf-8")) or {},
                                  str(out_dir / RUN_CONFIG)).train
        rows = read_history(out_dir / METRICS)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, yaml.YAMLError, CaptionerError):
        return None
    column = f"val_{config.val_metric}"
    scored = [row for row in rows if column in row]
    if not scored or rows[-1] is not scored[-1] or "epochs_done" in rows[-1]:  # the last: mid-epoch, or unscored
        return None
    best = max(row[column] for row in scored)
    best_epoch = [row["epoch"] for row in scored if row[column] == best][-1]
    return why_training_ended(rows[-1]["epoch"], best_epoch, config.epochs, config.early_stopping_patience)
