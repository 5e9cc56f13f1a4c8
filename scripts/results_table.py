"""Print a Markdown table of `captioner evaluate` score files (scores_<split>.json), one row per run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

KEYS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")
HEADER = ("run", "images", "beam", *KEYS, "bad endings", "repeated bigrams", "grounding (uniform)")


class TableError(Exception):
    """A run without a readable scores file: one line naming it."""


def read_scores(run: str, split: str) -> dict[str, Any]:
    path = Path(run) / f"scores_{split}.json"
    if not path.is_file():
        raise TableError(f"{path}: no scores (run `captioner evaluate {run}/best.pt --split {split}` first)")
    try:
        report = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TableError(f"{path}: not a readable scores file ({e})") from None
    missing = [key for key in KEYS if key not in report.get("overall", {})]
    if missing:
        raise TableError(f"{path}: no {', '.join(missing)} in \"overall\" (scored with --fast?)")
    return report


def row(run: str, report: dict[str, Any]) -> str:
    overall = report["overall"]
    grounding = report.get("grounding")
    ground = f"{grounding['score']:.3f} ({grounding['uniform_baseline']:.3f})" if grounding else "-"
    stats = report.get("caption_stats")
    rates = [f"{100 * stats[k]:.1f}%" for k in ("bad_ending_rate", "repeated_bigram_rate")] if stats else ["-", "-"]
    cells = [Path(run).name, str(report.get("images", "-")), str(report.get("beam_size", "-")),
             *(f"{overall[k]:.3f}" for k in KEYS), *rates, ground]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="a folder holding scores_<split>.json (`captioner evaluate --out RUN`)")
    parser.add_argument("--split", default="test", help="which scores file of each run (default: test)")
    args = parser.parse_args(argv)
    try:
        rows = [row(run, read_scores(run, args.split)) for run in args.runs]
    except TableError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
