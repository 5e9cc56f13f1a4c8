"""The README's grounding and pointing-game table from `captioner evaluate --grounding
--saliency gradcam` score files: one row per map kind of each model, beside the baselines."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


class TableError(Exception):
    """An argument or scores file the table cannot be made from: one line naming it."""


def per_head_table(path: Path) -> dict:
    """The per-map grounding and pointing table of a scores file."""
    try:
        report = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TableError(f"{path}: not a readable scores file ({e})") from None
    table = (report.get("grounding") or {}).get("per_head") if isinstance(report, dict) else None
    if not table or not table.get("words"):
        raise TableError(f"{path}: no per-map grounding scores "
                         "(run `captioner evaluate CHECKPOINT --grounding` first)")
    return table


def rows(label: str, path: Path) -> list[str]:
    table = per_head_table(path)
    base = table["baselines"]
    out = []
    for name, scores in table["maps"].items():
        what = "Grad-CAM" if name == "gradcam" else (
            "attention" if name == "L0H0" and len(table["maps"]) <= 2 else name)
        if what.startswith("L") and "mean" not in what:
            what = f"layer {what[1]}, head {what.split('H')[1]}" + (" (best)" if name == table["best_head"] else "")
        elif what.endswith("mean") and what.startswith("L"):
            what = f"layer {what[1]}, mean of heads"
        elif what == "mean":
            what = "mean of all layers and heads"
        out.append(
            f"| {label} | {what} | {scores['grounding']:.3f} | {base['uniform_grounding']:.3f} | "
            f"{scores['pointing']:.3f} | {base['random_point']:.3f} | {base['centre_point']:.3f} |"
        )
    return out


def label_and_path(run: str) -> tuple[str, Path]:
    label, sep, path = run.partition("=")
    if not sep or not label or not path:
        raise TableError(f"{run!r}: expected LABEL=SCORES_JSON, e.g. LSTM=runs/shapes_lstm/scores_test.json")
    return label, Path(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="LABEL=SCORES_JSON")
    args = parser.parse_args(argv)
    try:
        table = [row for run in args.runs for row in rows(*label_and_path(run))]
    except TableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("| model | map | grounding | uniform | pointing hit rate | random point | image centre |")
    print("|---|---|---:|---:|---:|---:|---:|")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
