"""Plot validation and training curves of several runs side by side, from their metrics.csv alone
(no torch): left the validation score by epoch (mid-epoch scores at their fraction), right a
training column per epoch (`train_<name>`, e.g. the SCST stage's mean sample reward)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from captioner.apps.arguments import AnyOrderParser
from captioner.apps.cli import refused
from captioner.core.errors import CaptionerError
from captioner.training.history import METRICS, read_history
from captioner.viz.curves import check_figure_path, runs_figure, save_figure


def read_runs(specs: list[str], val: str) -> list[tuple[str, list[dict]]]:
    """(label, history) of each RUN_DIR:LABEL, each history holding the val_<val> column."""
    runs = []
    for spec in specs:
        run, _, label = spec.partition(":")
        if not run:
            raise CaptionerError(f"{spec!r}: expected RUN_DIR:LABEL, e.g. runs/shapes_lstm:LSTM")
        path = Path(run) / METRICS
        if not path.exists():
            raise CaptionerError(f"{path}: no metrics.csv (is {run} a train.out_dir?)")
        history = read_history(path)  # a damaged metrics.csv: its one line, naming the file, the row and the column
        if not any(f"val_{val}" in row for row in history):
            columns = sorted({key[4:] for row in history for key in row if key.startswith("val_")})
            raise CaptionerError(f"{path}: no val_{val} column for --val {val} (it has: "
                                 f"{', '.join(columns) or 'no validation yet'})")
        runs.append((label or run, history))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = AnyOrderParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("runs", nargs="+", help="RUN_DIR:LABEL")
    parser.add_argument("--val", default="CIDEr", help="validation column (val_<name>)")
    parser.add_argument("--train", default="reward", help="training column (train_<name>)")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    try:
        check_figure_path(args.out)  # before the runs are read and drawn
        runs = read_runs(args.runs, args.val)
        save_figure(runs_figure(runs, args.val, args.train, args.title), args.out)
    except CaptionerError as e:
        return refused(e)  # its one line, exit status 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    if status := main():  # exit only on a refusal: run in another process's interpreter (runpy), it goes on after
        sys.exit(status)
