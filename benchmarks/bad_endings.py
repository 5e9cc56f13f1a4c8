"""Bad endings, minimum length and the scores: one checkpoint decoded greedily, with beam 3 and
by sampling, with and without `suppress_bad_endings` and `min_length`, the images encoded once.
Prints a Markdown table: official metrics (or --fast), the share of captions ending on "a",
"with", "of", ... (caption_stats, the same word lists decoding suppresses), mean length,
captions cut at max_length and the decoding time.

    python benchmarks/bad_endings.py runs/flickr8k_lstm_lite0/best.pt --split test
"""

from __future__ import annotations

import argparse
import sys

from captioner.core.errors import CaptionerError

VARIANTS = {  # name -> Captioner.decode options
    "greedy": {"beam_size": 1},
    "greedy, no bad endings": {"beam_size": 1, "suppress_bad_endings": True},
    "greedy, min length 5": {"beam_size": 1, "min_length": 5},
    "greedy, min length 8": {"beam_size": 1, "min_length": 8},
    "beam 3": {"beam_size": 3},
    "beam 3, no bad endings": {"beam_size": 3, "suppress_bad_endings": True},
    "beam 3, min length 5": {"beam_size": 3, "min_length": 5},
    "beam 3, min length 8": {"beam_size": 3, "min_length": 8},
    "beam 3, no bad endings, min length 5": {"beam_size": 3, "suppress_bad_endings": True, "min_length": 5},
    "sampling (T 1, seed 0)": {"sample": True, "seed": 0},
    "sampling, no bad endings": {"sample": True, "seed": 0, "suppress_bad_endings": True},
    "sampling, min length 8": {"sample": True, "seed": 0, "min_length": 8},
}
KEYS = ("Bleu_4", "METEOR", "CIDEr")
HEADER = ("decoding", "BLEU-4", "METEOR", "CIDEr-D", "bad endings", "words", "cut off", "decode s")


def measure(checkpoint: str, split: str, device: str, batch_size: int | None, official: bool) -> None:
    from captioner.core.runtime import set_threads
    from captioner.data.datasets import load_split
    from captioner.evaluation.evaluate import decode_variants, encode_records
    from captioner.models.checkpoint import checkpoint_config, load_captioner

    set_threads()
    model = load_captioner(checkpoint, device)
    records = load_split(checkpoint_config(checkpoint).data, split)
    encoded = encode_records(model, records, batch_size, progress=False)
    metrics = "official metrics (pycocoevalcap)" if official else "fast in-process BLEU and CIDEr-D"
    print(f"{checkpoint} on {split} ({len(encoded.records)} images, max length {model.decode_config.max_length}, {metrics})\n")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" + "---:|" * (len(HEADER) - 1))
    for variant in decode_variants(model, encoded, VARIANTS, batch_size, official=official):
        scores, stats = variant.scores, variant.scores.caption_stats
        cells = [
            variant.name, *(f"{scores.overall[k]:.3f}" if k in scores.overall else "-" for k in KEYS),
            f"{100 * stats['bad_ending_rate']:.1f}%", f"{stats['mean_length']:.1f}",
            str(sum(not c.finished for c in variant.captions.values())), f"{variant.seconds:.1f}",
        ]
        print("| " + " | ".join(cells) + " |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a checkpoint file (best.pt, last.pt) or a run folder")
    parser.add_argument("--split", default="test", choices=("train", "val", "test"))
    parser.add_argument("--batch-size", type=int, default=None, help="images per batch (default: the config's decode.batch_size)")
    parser.add_argument("--device", default="auto", help="auto (a CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N")
    parser.add_argument("--fast", action="store_true", help="in-process BLEU and CIDEr-D instead of the official code (no Java)")
    args = parser.parse_args(argv)
    try:
        measure(args.checkpoint, args.split, args.device, args.batch_size, official=not args.fast)
    except CaptionerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
