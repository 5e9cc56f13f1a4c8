"""The README's grounding and pointing-game table from `captioner evaluate --grounding
--saliency gradcam` score files: one row per map kind of each model, beside the baselines.

    python scripts/interpret_table.py LSTM=runs/shapes_lstm/scores_test.json \
        transformer=runs/shapes_transformer/scores_test.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def rows(label: str, path: Path) -> list[str]:
    table = json.loads(path.read_text())["grounding"]["per_head"]
    base = table["baselines"]
    out = []
    for name, scores in table["maps"].items():
        what = "Grad-CAM" if name == "gradcam" else ("attention" if name == "L0H0" and len(table["maps"]) <= 2 else name)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="LABEL=SCORES_JSON")
    args = parser.parse_args()
    print("| model | map | grounding | uniform | pointing hit rate | random point | image centre |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for run in args.runs:
        label, path = run.split("=", 1)
        print("\n".join(rows(label, Path(path))))


if __name__ == "__main__":
    main()
