"""A run's history files, read without torch (scripts/plot_runs.py, the curves, scripts/run_state.py): metrics.csv,
a row per validation, step_losses.csv, the training loss at every logged step, and finished.json, written when the
training ends as its config says; and that rule (`why_training_ended`)."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable
from pathlib import Path

from captioner.core.bounded_files import read_text_file
from captioner.core.errors import CaptionerError
from captioner.core.files import write_atomically

METRICS = "metrics.csv"
RUN_CONFIG = "config.yaml"  # the config the run last started training with (fit writes it)
STEP_LOSSES = "step_losses.csv"
CURVES = "training_curves.png"  # drawn from the two above when the training returns (viz/curves.py)
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
    """metrics.csv's rows, numbers by column (a blank cell left out), epoch and step whole; [] where there is none
    yet. A damaged file (not UTF-8 text, a cell that is not a number, a row longer or shorter than the header, no
    epoch or step column) is one CaptionerError naming it, the row and the column."""
    rows = []
    for line, row in csv_rows(path, required=("epoch", "step")):
        numbers = {key: number(value, path, line, key) for key, value in row.items() if value != ""}
        for key in ("epoch", "step"):
            numbers[key] = count(numbers.get(key), path, line, key)
        rows.append(numbers)
    return rows


def csv_rows(path: Path, required: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) of a history CSV whose header holds the `required` columns, each row as long as the
    header; [] where the file is missing. A folder, a pipe or a device is refused unread (a FIFO never ends)."""
    if not path.exists():
        return []
    text = read_text_file(path, f"the run's {path.name}", CaptionerError)
    try:
        reader = csv.reader(io.StringIO(text, newline=""))
        header = next(reader, None)
        rows = [(reader.line_num, cells) for cells in reader if cells]  # a blank line: no row
    except csv.Error as e:
        raise CaptionerError(f"{path}: not a readable CSV file ({e})") from None
    if header is None:  # empty: written before its first row
        return []
    missing = [name for name in required if name not in header]
    if missing:
        raise CaptionerError(f"{path}: no {' or '.join(missing)} column (its header: {','.join(header)[:200]!r})")
    for line, cells in rows:
        if len(cells) != len(header):
            raise CaptionerError(f"{path}: line {line} has {len(cells)} cells, its header {len(header)}")
    return [(line, dict(zip(header, cells))) for line, cells in rows]


def number(text: str, path: Path, line: int, column: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise CaptionerError(f"{path}: line {line}, column {column}: {text[:40]!r} is not a number") from None


def count(value: float | None, path: Path, line: int, column: str) -> int:
    """`value` as a whole number of 0 or more (an epoch, a step), else one CaptionerError naming the cell."""
    if value is None or not math.isfinite(value) or value < 0 or value != int(value):
        raise CaptionerError(f"{path}: line {line}, column {column}: {value if value is not None else 'blank'} "
                             "is not a whole number of 0 or more")
    return int(value)


def epochs_trained(row: dict) -> float:
    """Where a history row sits on an epoch axis: mid-epoch validations (train.val_every_steps)
    at their fraction, `epochs_done`; the others at their epoch."""
    return row.get("epochs_done", row["epoch"])


def write_step_losses(path: Path, step_losses: list[list]) -> None:
    """[step, mean loss since the previous log] pairs, as the training loop logs them."""
    write_csv(path, ["step", "loss"], step_losses)


def read_step_losses(path: Path) -> list[tuple[int, float]]:
    """step_losses.csv's (step, loss) pairs; [] where there is none. Damaged: one CaptionerError, as `read_history`."""
    return [(count(number(row["step"], path, line, "step"), path, line, "step"),
             number(row["loss"], path, line, "loss")) for line, row in csv_rows(path, required=("step", "loss"))]


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

    try:
        stored = yaml.safe_load(read_text_file(out_dir / RUN_CONFIG, "the run's config", CaptionerError))
        if not isinstance(stored, dict):  # damaged: a list, a number, empty
            return None
        config = config_from_dict(stored, str(out_dir / RUN_CONFIG)).train
        rows = read_history(out_dir / METRICS)
    except (OSError, ValueError, RecursionError, yaml.YAMLError, CaptionerError):
        return None
    column = f"val_{config.val_metric}"
    scored = [row for row in rows if column in row]
    if not scored or rows[-1] is not scored[-1] or "epochs_done" in rows[-1]:  # the last: mid-epoch, or unscored
        return None
    if not all(math.isfinite(row[column]) for row in scored):  # not a score any run wrote: damaged
        return None
    best = max(row[column] for row in scored)
    best_epoch = [row["epoch"] for row in scored if row[column] == best][-1]
    return why_training_ended(rows[-1]["epoch"], best_epoch, config.epochs, config.early_stopping_patience)
