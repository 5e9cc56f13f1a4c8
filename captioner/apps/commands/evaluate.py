"""`captioner evaluate`: a checkpoint on a split (official metrics, grounding, saliency), or a
COCO results file."""

from __future__ import annotations

import argparse
import json

from captioner.apps.arguments import add_decode_arguments


def add_parser(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser("evaluate", help="score a checkpoint on a split, or a results file")
    evaluate.add_argument("checkpoint", nargs="?")
    evaluate.add_argument("--split", default="test", choices=("train", "val", "test"))
    evaluate.add_argument(
        "--out",
        help="folder (or .json file with --results) for results and scores (default: next to the checkpoint; "
        "with --results, runs/eval/<results name>_scores.json)",
    )
    evaluate.add_argument("--limit", type=int, default=0, help="evaluate the first N images only")
    evaluate.add_argument("--results", help="score a COCO-format results file instead of a checkpoint")
    evaluate.add_argument("--annotations", help="the COCO caption annotation file for --results")
    evaluate.add_argument("--features", metavar="DIR", help="decode the frozen encoder's feature store in DIR (built there when absent)")
    evaluate.add_argument("--fast", action="store_true", help="in-process BLEU/CIDEr-D instead of the official code")
    evaluate.add_argument("--spice", action="store_true", help="also SPICE (needs its Stanford CoreNLP models)")
    evaluate.add_argument("--grounding", action="store_true", help="score attention against instance masks")
    evaluate.add_argument("--instances", help="COCO instances_*.json for --grounding (shapes: found by itself)")
    evaluate.add_argument("--heatmaps", metavar="OUTDIR", help="with --grounding: figures of the first images, true regions outlined")
    evaluate.add_argument("--saliency", choices=("gradcam",), default=None,
                          help="with --grounding: also score Grad-CAM of each grounded word (one gradient pass per caption)")
    evaluate.add_argument("--layer", type=int, default=-1, help="decoder layer of the maps (transformer)")
    evaluate.add_argument("--head", type=int, default=None, help="attention head (default: mean over heads)")
    add_decode_arguments(evaluate)
    evaluate.add_argument("--json", action="store_true")
    evaluate.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from captioner.evaluation.evaluate import run_evaluation

    report = run_evaluation(args)
    if args.json:
        print(json.dumps(report, indent=1))
    return 0
