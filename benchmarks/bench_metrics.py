"""Time the official COCO metrics over all of COCO val2014: pycocoevalcap's own code (before) and
`score_official` (after), stage by stage, with the largest score difference. Wall and CPU seconds;
each image's first reference is scored (--held-out: against the other four). It decides
`meteor.default_processes` and checks the scores stay equal to pycocoevalcap's. --tokenizer-rounds times the
PTB tokenizer alone under the JVM options the Java tools run with and under Java's defaults."""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from captioner.apps.arguments import nonnegative_int
from captioner.evaluation import java
from captioner.evaluation.meteor import default_processes
from captioner.evaluation.metrics import fast_scores, ptb_token_lines, pycocoevalcap_scores, score_official
from captioner.evaluation.results_files import load_references

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.shared_data import SHARED_DATA  # noqa: E402
from benchmarks.timing import argument_parser, print_environment, run_main  # noqa: E402

STAGES = ("PTB tokenizer", "n-gram counts", "BLEU", "ROUGE-L", "CIDEr-D", "METEOR", "total")


def cpu_seconds(run: Callable[[], Any]) -> tuple[Any, float, float]:
    """run()'s result, and the CPU seconds it took in this process (all threads) and in the child
    processes it started and reaped (the Java tools). CPU time, unlike wall time, hardly changes
    with what else runs on the machine."""
    self_before = resource.getrusage(resource.RUSAGE_SELF)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run()
    self_after = resource.getrusage(resource.RUSAGE_SELF)
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)

    def used(after: Any, before: Any) -> float:
        return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime

    return result, used(self_after, self_before), used(children_after, children_before)


def compare_tokenizer_options(captions: list[str], rounds: int) -> int:
    """The PTB tokenizer on `captions`, under java.JVM_OPTIONS and under Java's defaults in turn: best and worst
    wall and Java CPU seconds of each, and whether every run gave the same lines."""
    options = {"JVM_OPTIONS " + " ".join(java.JVM_OPTIONS): list(java.JVM_OPTIONS), "Java's defaults": []}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in options}
    outputs = set()
    try:
        for _ in range(rounds):
            for name, chosen in options.items():
                java.JVM_OPTIONS[:] = chosen
                start = time.perf_counter()
                lines, _, java_cpu = cpu_seconds(lambda: ptb_token_lines(captions))
                runs[name].append((time.perf_counter() - start, java_cpu))
                outputs.add(hash(tuple(lines)))
    finally:
        java.JVM_OPTIONS[:] = next(iter(options.values()))
    print(f"{len(captions)} captions, {rounds} rounds each\n")
    print("| PTB tokenizer under | wall (s), best - worst | Java CPU (s), best - worst |")
    print("|---|---:|---:|")
    for name, timed in runs.items():
        walls, cpus = [w for w, _ in timed], [c for _, c in timed]
        print(f"| {name} | {min(walls):.2f} - {max(walls):.2f} | {min(cpus):.2f} - {max(cpus):.2f} |")
    print(f"the same lines from every run: {len(outputs) == 1}")
    return 0 if len(outputs) == 1 else 1


def main(argv: list[str] | None = None) -> int:
    shared = SHARED_DATA
    parser = argument_parser("metrics", __doc__)
    parser.add_argument("annotations", nargs="?", type=Path, default=shared / "coco" / "captions_val2014.json")
    parser.add_argument("--images", type=nonnegative_int, default=0, help="score only the first N images (0: all)")
    parser.add_argument("--meteor-processes", type=nonnegative_int, default=0,
                        help="METEOR processes (0: the default for this machine)")
    parser.add_argument("--held-out", action="store_true", help="score the first caption against the others only")
    parser.add_argument("--no-before", action="store_true", help="skip pycocoevalcap's own run")
    parser.add_argument("--spice", action="store_true", help="also compute SPICE after (needs its CoreNLP models)")
    parser.add_argument("--tokenizer-rounds", type=nonnegative_int, default=0,
                        help="instead, time the PTB tokenizer alone on every caption, N rounds of java.JVM_OPTIONS "
                             "and of Java's defaults in turn")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    references = load_references(args.annotations)  # a missing or malformed file: one line (run_main)
    print_environment(args)
    if args.images:
        references = {i: references[i] for i in sorted(references)[: args.images]}
    predictions = {image_id: captions[0] for image_id, captions in references.items()}
    if args.held_out:
        references = {image_id: captions[1:] for image_id, captions in references.items() if len(captions) > 1}
        predictions = {image_id: predictions[image_id] for image_id in references}
        if not predictions:
            raise SystemExit(f"{args.annotations}: --held-out scores a first caption against the others, and no "
                             f"image{' of the first --images' if args.images else ''} has two captions")
    if args.tokenizer_rounds:
        return compare_tokenizer_options([c for captions in references.values() for c in captions],
                                         args.tokenizer_rounds)
    processes = args.meteor_processes or default_processes(len(predictions))
    print(f"{len(predictions)} images, {sum(map(len, references.values()))} references; "
          f"{len(os.sched_getaffinity(0))} cores, {processes} METEOR processes")

    print(f"after: load average {os.getloadavg()[0]:.1f} at the start")
    after, after_python, after_java = cpu_seconds(
        lambda: score_official(references, predictions, spice=args.spice, meteor_processes=processes)
    )
    before_overall, before_per_image, before_s = {}, {}, {}
    before_python = before_java = float("nan")
    if not args.no_before:
        print(f"before: load average {os.getloadavg()[0]:.1f} at the start")
        (before_overall, before_per_image, before_s), before_python, before_java = cpu_seconds(
            lambda: pycocoevalcap_scores(references, predictions)
        )
    start = time.perf_counter()
    fast = fast_scores(references, predictions)
    fast_s = time.perf_counter() - start
    print(f"load average {os.getloadavg()[0]:.1f} at the end")

    print("\n| stage | before: pycocoevalcap (s) | after: score_official (s) |")
    print("|---|---:|---:|")
    for stage in (*STAGES, *(["SPICE"] if "SPICE" in after.seconds else [])):
        old = f"{before_s[stage]:.1f}" if stage in before_s else "-"
        new = f"{after.seconds[stage]:.1f}" if stage in after.seconds else "-"
        note = " (beside BLEU, ROUGE-L, CIDEr-D)" if stage == "METEOR" else ""
        print(f"| {stage}{note} | {old} | {new} |")
    print(f"| CPU seconds: Python (all threads) | {before_python:.1f} | {after_python:.1f} |")
    print(f"| CPU seconds: Java (tokenizer, METEOR) | {before_java:.1f} | {after_java:.1f} |")
    print(f"| fast_scores (in-process tokenizer, BLEU + CIDEr-D) | | {fast_s:.1f} |")

    print("\n| metric | before | after | largest per-image difference |")
    print("|---|---:|---:|---:|")
    for key, value in after.overall.items():
        if key in before_overall:
            worst = max(abs(before_per_image[i][key] - after.per_image[i][key]) for i in after.per_image)
            print(f"| {key} | {before_overall[key]:.6f} | {value:.6f} | {worst:.1e} |")
        else:
            print(f"| {key} | - | {value:.6f} | - |")
    print("fast_scores:", ", ".join(f"{key} {value:.6f}" for key, value in fast.items()))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
