"""Compare decoding options on one checkpoint: official metrics, tutorial-style nltk BLEU-4 and
the caption statistics per option, the images encoded once. Prints a Markdown table. With
--ensemble the checkpoints decode as one model, on the first checkpoint's split."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from captioner.apps.arguments import AnyOrderParser, add_ensemble_arguments, decode_value, load_model, positive_int
from captioner.core.decode_schema import OPTIONS as DECODE_OPTIONS
from captioner.apps.cli import refused
from captioner.core.errors import CaptionerError
from captioner.core.files import check_writable_file

VARIANTS = {  # name -> Captioner.decode options
    "greedy": {"beam_size": 1},
    "greedy + trigram blocking": {"beam_size": 1, "block_trigrams": True},
    "beam 3": {"beam_size": 3},
    "beam 3 + trigram blocking": {"beam_size": 3, "block_trigrams": True},
    "diverse beam 3 (3 groups, lambda 0.5)": {"beam_size": 3, "diverse_groups": 3, "diversity_strength": 0.5},
}
KEYS = ("Bleu_1", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")
HEADER = ("decoding", *KEYS, "nltk BLEU-4", "p1", "length ratio", "BP", "bad endings", "repeated bigram", "words",
          "cut off", "decode s")


def length_penalty_variants(beam_size: int, alphas: list[float]) -> dict[str, dict[str, float]]:
    """Beam search ranked by log-probability / ((5 + length) / 6) ** alpha, for each alpha."""
    return {f"beam {beam_size}, length penalty {alpha:g}": {"beam_size": beam_size, "length_penalty": alpha}
            for alpha in alphas}


def length_penalties(text: str) -> list[float]:
    """--length-penalties' alphas, each one a length penalty decoding takes."""
    try:
        alphas = [float(a) for a in text.split(",")]
    except ValueError:
        raise CaptionerError(f"--length-penalties: expected numbers separated by commas, got {text!r}") from None
    option = DECODE_OPTIONS["length_penalty"]
    for alpha in alphas:
        if not option.allows(alpha):
            raise CaptionerError(f"--length-penalties: {option.refusal(alpha)}")
    return alphas


def compare(
    checkpoint: str, split: str, device: str, batch_size: int | None,
    variants: dict[str, dict[str, float]] | None = None,
    json_path: str | None = None, ensemble: list[str] | None = None, combine: str | None = None,
) -> None:
    from captioner.core.process_settings import set_threads
    from captioner.data.datasets import load_split
    from captioner.evaluation.evaluate import decode_variants, encode_records
    from captioner.models.checkpoint import checkpoint_config

    set_threads()
    members = [checkpoint, *(ensemble or [])]
    model = load_model("compare_decoding", checkpoint,
                       argparse.Namespace(device=device, ensemble=ensemble or [], combine=combine))
    records = load_split(checkpoint_config(checkpoint).data, split)
    encoded = encode_records(model, records, batch_size)
    combined = f" ({combine or 'prob'})" if ensemble else ""
    print(f"{' + '.join(members)}{combined} on {split} ({len(encoded.records)} images)\n")
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" + "---:|" * (len(HEADER) - 1))
    variants = variants or VARIANTS
    rows = []
    for variant in decode_variants(model, encoded, variants, batch_size):
        scores, stats = variant.scores, variant.scores.caption_stats
        rows.append({"name": variant.name, "options": variants[variant.name], "overall": scores.overall,
                     **scores.beside_official(), "seconds": round(variant.seconds, 2)})
        cells = [
            variant.name, *(f"{scores.overall[k]:.3f}" for k in KEYS),
            f"{scores.tutorial_bleu['nltk_corpus_BLEU_4']:.3f}",
            f"{scores.bleu_parts.precisions[0]:.3f}", f"{scores.bleu_parts.length_ratio:.3f}",
            f"{scores.bleu_parts.brevity_penalty:.3f}",
            f"{100 * stats['bad_ending_rate']:.1f}%", f"{100 * stats['repeated_bigram_rate']:.1f}%",
            f"{stats['mean_length']:.1f}", str(sum(not c.finished for c in variant.captions.values())),
            f"{variant.seconds:.1f}",
        ]
        print("| " + " | ".join(cells) + " |", flush=True)
    if json_path:
        from captioner.core.files import write_atomically

        ensembled = {"ensemble": members, "combine": combine or "prob"} if ensemble else {}
        text = json.dumps(
            {"checkpoint": checkpoint, **ensembled, "split": split, "images": len(encoded.records), "variants": rows},
            indent=1
        ) + "\n"
        write_atomically(Path(json_path), lambda tmp: tmp.write_text(text, encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = AnyOrderParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a checkpoint file (best.pt, last.pt)")
    parser.add_argument("--split", default="test", choices=("train", "val", "test"))
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help="images per batch (default: the config's decode.batch_size)")
    parser.add_argument("--device", default="auto",
                        help="auto (a CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N")
    parser.add_argument("--length-penalties", metavar="A,B,...",
                        help="instead of the fixed variants: beam --beam with each length penalty alpha")
    parser.add_argument("--beam", type=decode_value("beam_size"), default=3, help="beam width for --length-penalties")
    add_ensemble_arguments(parser)
    parser.add_argument("--json", metavar="PATH",
                        help="also write every variant's options, scores and statistics as JSON")
    args = parser.parse_args(argv)
    try:
        variants = None
        if args.length_penalties is not None:
            variants = length_penalty_variants(args.beam, length_penalties(args.length_penalties))
        if args.json:
            check_writable_file(args.json)  # before the split is encoded
        compare(args.checkpoint, args.split, args.device, args.batch_size, variants, args.json, args.ensemble,
                args.combine)
    except CaptionerError as e:
        return refused(e)  # its one line, exit status 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
