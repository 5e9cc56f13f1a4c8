"""Time the official COCO metrics (and the fast in-process ones) over all of COCO val2014.

Predictions are the first reference caption of each of the 40,504 images, scored against all its
references (itself included, so the scores are high): a full-size workload, not a result.

    python benchmarks/bench_metrics.py [path/to/captions_val2014.json] [--spice]

The default annotation file is coco/captions_val2014.json under $CAPTIONER_SHARED_DATA, else under
the shared/data folder beside the repository.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from captioner.evaluation.metrics import fast_scores, official_scores
from captioner.evaluation.results_files import load_references


def main() -> None:
    shared = Path(os.environ.get("CAPTIONER_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("annotations", nargs="?", type=Path, default=shared / "coco" / "captions_val2014.json")
    parser.add_argument("--spice", action="store_true", help="also compute SPICE (needs its CoreNLP models)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    references = load_references(args.annotations)
    predictions = {image_id: captions[0] for image_id, captions in references.items()}
    print(f"{len(predictions)} images, {sum(map(len, references.values()))} references")

    start = time.perf_counter()
    overall, _ = official_scores(references, predictions, spice=args.spice)
    official_s = time.perf_counter() - start
    print(f"official_scores: {official_s:.1f} s")
    for key, value in overall.items():
        print(f"  {key}: {value:.4f}")

    start = time.perf_counter()
    fast = fast_scores(references, predictions)
    fast_s = time.perf_counter() - start
    print(f"fast_scores: {fast_s:.1f} s")
    for key, value in fast.items():
        print(f"  {key}: {value:.4f}")


if __name__ == "__main__":
    main()
