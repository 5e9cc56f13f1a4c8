"""Time several official scorings of one split: one `score_official` call per job (before) against
one `score_official_many` call for all of them (after), which starts the PTB tokenizer and the
METEOR processes once. The jobs are what a decoding sweep or a leave-one-out makes: K prediction
sets over the same N images, the k-th reference of each image as the k-th set's captions, scored
against all its references.

    python benchmarks/bench_score_many.py [path/to/captions_val2014.json] [--images 1000] [--jobs 5]

Wall seconds change with what else runs on the cores; the CPU seconds (Python, and the Java tools
apart) hardly do. The scores of both paths are compared, and must be equal.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from bench_metrics import cpu_seconds
from shared_data import SHARED_DATA

from captioner.evaluation.metrics import score_official, score_official_many
from captioner.evaluation.results_files import load_references


def main() -> None:
    shared = SHARED_DATA
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("annotations", nargs="?", type=Path, default=shared / "coco" / "captions_val2014.json")
    parser.add_argument("--images", type=int, default=1000, help="images per job (Flickr8k's dev and test have 1,000)")
    parser.add_argument("--jobs", type=int, default=5, help="prediction sets (a sweep of 5 length penalties, 5 folds)")
    args = parser.parse_args()

    references = load_references(args.annotations)
    references = {i: references[i] for i in sorted(references)[: args.images]}
    jobs = [(references, {i: captions[k % len(captions)] for i, captions in references.items()}) for k in range(args.jobs)]
    print(f"{args.jobs} jobs of {len(references)} images; {len(os.sched_getaffinity(0))} cores, "
          f"load average {os.getloadavg()[0]:.1f} at the start")

    start = time.perf_counter()
    before, before_python, before_java = cpu_seconds(lambda: [score_official(*job) for job in jobs])
    before_wall = time.perf_counter() - start
    start = time.perf_counter()
    after, after_python, after_java = cpu_seconds(lambda: score_official_many(jobs))
    after_wall = time.perf_counter() - start
    print(f"load average {os.getloadavg()[0]:.1f} at the end")

    print("\n| | before: one score_official per job | after: score_official_many |")
    print("|---|---:|---:|")
    print(f"| wall seconds | {before_wall:.1f} | {after_wall:.1f} |")
    print(f"| CPU seconds: Python (all threads) | {before_python:.1f} | {after_python:.1f} |")
    print(f"| CPU seconds: Java (tokenizer, METEOR) | {before_java:.1f} | {after_java:.1f} |")
    same = all(b.overall == a.overall and b.per_image == a.per_image for b, a in zip(before, after))
    print(f"\nscores equal: {same}; CIDEr-D of the jobs: " + ", ".join(f"{a.overall['CIDEr']:.3f}" for a in after))
    if not same:
        raise SystemExit("the scores differ")


if __name__ == "__main__":
    main()
