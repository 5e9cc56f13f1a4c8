"""Plot validation and training curves of several runs side by side, from their metrics.csv alone
(no torch): left the validation score by epoch (mid-epoch scores at their fraction), right a
training column per epoch (`train_<name>`, e.g. the SCST stage's mean sample reward)."""

from __future__ import annotations

import argparse
from pathlib import Path

from captioner.core.errors import CaptionerError
from captioner.training.history import METRICS, read_history
from captioner.viz.curves import runs_figure, save_figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("runs", nargs="+", help="RUN_DIR:LABEL")
    parser.add_argument("--val", default="CIDEr", help="validation column (val_<name>)")
    parser.add_argument("--train", default="reward", help="training column (train_<name>)")
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    runs = []
    for spec in args.runs:
        run, _, label = spec.partition(":")
        path = Path(run) / METRICS
        if not path.is_file():
            raise SystemExit(f"error: {path}: no metrics.csv (is {run} a train.out_dir?)")
        try:
            history = read_history(path)
        except CaptionerError as e:  # a damaged metrics.csv: its one line, naming the file, the row and the column
            raise SystemExit(f"error: {e}") from None
        if not any(f"val_{args.val}" in row for row in history):
            columns = sorted({key[4:] for row in history for key in row if key.startswith("val_")})
            raise SystemExit(f"error: {path}: no val_{args.val} column for --val {args.val} (it has: "
                             f"{', '.join(columns) or 'no validation yet'})")
        runs.append((label or run, history))
    save_figure(runs_figure(runs, args.val, args.train, args.title), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
