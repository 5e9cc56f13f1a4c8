"""Is run B's gain over run A real? A paired bootstrap over the test images of two evaluations.
Each argument is a run folder holding scores_<split>.json (or the JSON itself); prints the relative
gain with its 95% interval and the share of draws in which B beats A (captioner/evaluation/significance.py)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from captioner.apps.arguments import AnyOrderParser, nonnegative_int, positive_int
from captioner.apps.cli import refused
from captioner.core.errors import CaptionerError
from captioner.evaluation.significance import (
    MEAN_METRICS,
    paired_bootstrap,
    per_image_scores,
)


def scores_path(run: str, split: str) -> Path:
    path = Path(run)
    return path / f"scores_{split}.json" if path.is_dir() else path


def finite_number(text: str) -> float:
    """argparse type of --goal: a finite number (a gain of NaN or infinity is reached by no draw)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number such as 0.1, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = AnyOrderParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="run folder (or scores JSON) of the run to compare against")
    parser.add_argument("new", help="run folder (or scores JSON) of the run whose gain is measured")
    parser.add_argument("--metric", default="CIDEr", choices=MEAN_METRICS)
    parser.add_argument("--split", default="test")
    parser.add_argument("--samples", type=positive_int, default=10_000)
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    parser.add_argument("--goal", type=finite_number, default=None,
                        help="a relative gain, e.g. 0.10: also print the share of draws that reach it")
    args = parser.parse_args(argv)
    try:
        base = per_image_scores(scores_path(args.base, args.split), args.metric)
        new = per_image_scores(scores_path(args.new, args.split), args.metric)
        result = paired_bootstrap(base, new, args.samples, args.seed, goal=args.goal)
    except CaptionerError as e:
        return refused(e)  # its one line, exit status 2
    print(f"{args.metric} on {result.images} images: {result.base:.4f} -> {result.new:.4f}, "
          f"gain {100 * result.gain:+.1f}% "
          f"(95% interval {100 * result.low:+.1f}% to {100 * result.high:+.1f}%; {result.samples} paired draws)")
    print(f"  new run higher in {100 * result.p_positive:.1f}% of draws"
          + ("" if result.p_goal is None else f"; gain >= {100 * args.goal:.0f}% in {100 * result.p_goal:.1f}%"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
