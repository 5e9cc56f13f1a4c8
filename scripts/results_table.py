"""Print a Markdown table of `captioner evaluate` score files (scores_test.json), one row per run.

    python scripts/results_table.py runs/flickr8k_lstm_lite0 runs/flickr8k_lstm_lite0_blind ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEYS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")


def main(runs: list[str], split: str = "test") -> None:
    header = ["run", "images", "beam", *KEYS, "bad endings", "repeated bigrams", "grounding (uniform)"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for run in runs:
        path = Path(run) / f"scores_{split}.json"
        if not path.is_file():
            sys.exit(f"error: {path}: no scores (run `captioner evaluate {run}/best.pt --split {split}` first)")
        report = json.loads(path.read_text())
        overall = report["overall"]
        grounding = report.get("grounding")
        ground = f"{grounding['score']:.3f} ({grounding['uniform_baseline']:.3f})" if grounding else "-"
        stats = report.get("caption_stats")
        rates = [f"{100 * stats[k]:.1f}%" for k in ("bad_ending_rate", "repeated_bigram_rate")] if stats else ["-", "-"]
        cells = [Path(run).name, str(report["images"]), str(report["beam_size"]), *(f"{overall[k]:.3f}" for k in KEYS), *rates, ground]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
