"""Compare decoding options on one checkpoint: official metrics, tutorial-style nltk BLEU-4 and
the caption statistics per option, the images encoded once. Prints a Markdown table.

    python scripts/compare_decoding.py runs/flickr8k_lstm_lite0/best.pt --split test
"""

from __future__ import annotations

import argparse
import time

import torch

from captioner.data.datasets import load_split
from captioner.evaluation.caption_stats import caption_stats
from captioner.evaluation.evaluate import (
    beside_official,
    caption_records,
    references_for,
)
from captioner.evaluation.metrics import official_scores
from captioner.models.checkpoint import load_captioner
from captioner.training.fit import encode_records

VARIANTS = {  # name -> Captioner.decode options
    "greedy": {"beam_size": 1},
    "greedy + trigram blocking": {"beam_size": 1, "block_trigrams": True},
    "beam 3": {"beam_size": 3},
    "beam 3 + trigram blocking": {"beam_size": 3, "block_trigrams": True},
    "diverse beam 3 (3 groups, lambda 0.5)": {"beam_size": 3, "diverse_groups": 3, "diversity_strength": 0.5},
}
KEYS = ("Bleu_1", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--split", default="test")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_captioner(args.checkpoint)
    records = load_split(model.config.data, args.split)
    features, grid, records = encode_records(model, records, 16, 0, f"encoding {args.split}")
    header = ["decoding", *KEYS, "nltk BLEU-4", "bad endings", "repeated bigram", "words", "cut off", "decode s"]
    print(f"{args.checkpoint} on {args.split} ({len(records)} images)\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" + "---:|" * (len(header) - 1))
    for name, options in VARIANTS.items():
        start = time.perf_counter()
        captions = caption_records(model, records, features=features, grid=grid, progress=False, **options)
        seconds = time.perf_counter() - start
        references = references_for(records, captions)
        predictions = {i: c.text for i, c in captions.items()}
        overall, _ = official_scores(references, predictions)
        extra = beside_official(references, predictions, fast=False)
        stats = caption_stats(predictions.values())
        cut = sum(not c.finished for c in captions.values())
        cells = [
            name, *(f"{overall[k]:.3f}" for k in KEYS), f"{extra['tutorial_bleu']['nltk_corpus_BLEU_4']:.3f}",
            f"{100 * stats['bad_ending_rate']:.1f}%", f"{100 * stats['repeated_bigram_rate']:.1f}%",
            f"{stats['mean_length']:.1f}", str(cut), f"{seconds:.1f}",
        ]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
