"""Plot validation and training curves of several runs side by side, from their metrics.csv.

    python scripts/plot_runs.py OUT.png RUN_DIR:LABEL [RUN_DIR:LABEL ...] [--val CIDEr] [--train reward]

Left: the validation score per epoch (epoch 0 is an SCST stage's starting model; with
train.val_every_steps, mid-epoch scores sit at their fraction of an epoch); right: a
training column per epoch (`train_<name>`, e.g. the SCST stage's mean sample reward).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from captioner.training.fit import epochs_trained, read_history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("runs", nargs="+", help="RUN_DIR:LABEL")
    parser.add_argument("--val", default="CIDEr", help="validation column (val_<name>)")
    parser.add_argument("--train", default="reward", help="training column (train_<name>)")
    parser.add_argument("--title", default="")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_val, ax_train) = plt.subplots(1, 2, figsize=(11, 4))
    for spec in args.runs:
        run, _, label = spec.partition(":")
        path = Path(run) / "metrics.csv"
        if not path.is_file():
            raise SystemExit(f"error: {path}: no metrics.csv (is {run} a train.out_dir?)")
        history = read_history(path)
        val = [(epochs_trained(r), r[f"val_{args.val}"]) for r in history if f"val_{args.val}" in r]
        train = [(r["epoch"], r[f"train_{args.train}"]) for r in history if f"train_{args.train}" in r]
        line = ax_val.plot(*zip(*val), "o-", label=label or run)[0]
        if train:
            ax_train.plot(*zip(*train), "o-", color=line.get_color(), label=label or run)
    ax_val.set(xlabel="epoch", ylabel=f"val {args.val}", title=args.title or f"validation {args.val}")
    ax_train.set(xlabel="epoch", ylabel=f"train {args.train}", title=f"training {args.train} (epoch mean)")
    ax_val.legend(fontsize=8)
    ax_train.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
