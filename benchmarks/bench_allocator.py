"""glibc malloc's defaults against the thresholds `captioner` sets (captioner.core.allocator), workload by
workload: each in fresh processes, the two allocators alternating round by round, side by side in one run.

    python -m benchmarks allocator [--only NAME ...] [--rounds 3] [--repeats 5] [--threads N]

A process builds one workload of `benchmarks/workloads.py`, runs it twice untimed, then `--repeats` times
timed; it reports its median, the minor page faults per call (the pages of blocks glibc mapped afresh) and its
peak resident memory. The table gives the median over the rounds of each allocator's medians.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
from pathlib import Path

from captioner.apps.arguments import positive_int
from captioner.core.config_sections import thread_count

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.timing import argument_parser, child_json, in_turn, measure, print_environment, run_main  # noqa: E402

DEFAULT = ("quickstart_step", "packaged_encoder", "lstm_train", "transformer_train", "lstm_beam")
ALLOCATORS = {"glibc": "glibc's defaults", "captioner": "large blocks kept (captioner)"}


def child(name: str, repeats: int, threads: int | None) -> dict:
    """In this process: `name` under the allocator the environment chose -> its median seconds, faults a call,
    peak RSS in MB and whether the thresholds were set."""
    from captioner.core.allocator import keep_large_blocks
    from captioner.core.process_settings import set_threads

    kept = keep_large_blocks()
    set_threads(threads)
    from benchmarks import workloads

    work = workloads.WORKLOADS[name]()
    for _ in range(2):
        work.run()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    timed = measure(work.run, repeats, warmup=0)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / repeats
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": timed.median, "faults": faults, "peak_mb": peak, "kept": kept, "about": work.about}


def run_child(name: str, allocator: str, args: argparse.Namespace) -> dict:
    """`child` in a fresh process under `allocator` (a key of ALLOCATORS)."""
    env = {**os.environ, "CAPTIONER_MALLOC": "glibc" if allocator == "glibc" else ""}
    options = ["--child", name, "--repeats", str(args.repeats)]
    if args.threads:
        options += ["--threads", str(args.threads)]
    result = child_json("allocator", options, env, what=f"{name} under {allocator}")
    if result["kept"] != (allocator == "captioner"):
        raise SystemExit(f"{name}: the thresholds were {'' if result['kept'] else 'not '}set under {allocator}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("allocator", __doc__, malloc="glibc")
    parser.add_argument("--only", nargs="+", choices=DEFAULT, default=list(DEFAULT), help="these workloads only")
    parser.add_argument("--rounds", type=positive_int, default=3, help="processes of each allocator, alternating")
    parser.add_argument("--repeats", type=positive_int, default=5,
                        help="timed calls in each process, after two untimed")
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="torch threads (default: as captioner.core.process_settings sets them)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one process's measurement
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.repeats, args.threads)))
        return 0
    print_environment(args)
    print(f"\n{args.rounds} round(s), each a fresh process per allocator ({', '.join(ALLOCATORS.values())}), "
          f"{args.repeats} timed calls each")
    print("\n| work | glibc's defaults | large blocks kept | speed-up | page faults a call | peak RSS MB |\n"
          "|---|---:|---:|---:|---:|---:|")
    for name in args.only:
        results: dict[str, list[dict]] = {allocator: [] for allocator in ALLOCATORS}
        for allocator in in_turn(list(ALLOCATORS), args.rounds):
            results[allocator].append(run_child(name, allocator, args))
        ms = {a: statistics.median(r["seconds"] for r in results[a]) * 1e3 for a in ALLOCATORS}
        faults = {a: statistics.median(r["faults"] for r in results[a]) for a in ALLOCATORS}
        peak = {a: max(r["peak_mb"] for r in results[a]) for a in ALLOCATORS}
        print(f"| {results['glibc'][0]['about']} | {ms['glibc']:,.0f} ms | {ms['captioner']:,.0f} ms | "
              f"{ms['glibc'] / ms['captioner']:.2f}x | {faults['glibc']:,.0f} / {faults['captioner']:,.0f} | "
              f"{peak['glibc']:,.0f} / {peak['captioner']:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
