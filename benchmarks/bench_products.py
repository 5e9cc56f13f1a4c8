"""The dense layers' products: torch's own (MKL's sgemm for fp32) against oneDNN's inner product
with a reordered weight, alternating call by call. The shapes are the LSTM decoder's at COCO sizes,
with each route's error from float64; it decides the route of `captioner.models.products`.

    python -m benchmarks products [--repeats 20] [--threads N]
    python -m benchmarks products --steps [--pairs 8]

`--steps` times whole workloads instead (the LSTM train step and beam search of `benchmarks/workloads.py`)
with the dense layers through F.linear and through oneDNN, call by call in turn in one process, the
gradients' products as the machine cache's decision names them."""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from captioner.apps.arguments import positive_int
from captioner.core.process_settings import set_threads
from captioner.core.config_sections import thread_count
from captioner.models import products

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.timing import alternate, argument_parser, measure, print_environment, run_main, summarise  # noqa: E402

STEPS = ("lstm_train", "lstm_beam")  # the workloads `--steps` times

# (what, rows M, inputs K, outputs N, whether each call reorders its weight: training's
# weights change at every step; decoding reuses the copy cached for the weight)
SHAPES = [
    ("beam step, 96 rows: deep output to 10k words", 96, 512, 10_000, False),
    ("beam step, 96 rows: LSTM input weights [E y; z]", 96, 2_560, 2_048, False),
    ("beam step, 96 rows: gate f_beta / recurrent weights", 96, 512, 2_048, False),
    ("beam step, 96 rows: L_z context to embedding", 96, 2_048, 512, False),
    ("beam step, 3 rows (one image): deep output", 3, 512, 10_000, False),
    ("training: W_h over the grid, 32 x 196 cells (reordered each call)", 6_272, 2_048, 512, True),
    ("training: deep output, 640 words (reordered each call)", 640, 512, 10_000, True),
    ("training step t: h_{t-1} products, 32 rows (reordered once a step)", 32, 512, 4_608, False),
    ("training step t: context into the cell, 32 rows (reordered once a step)", 32, 2_048, 2_048, False),
]


def alternating(a: Callable[[], object], b: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median ms of each, one call of each in turn, after a warm-up of both."""
    timings = alternate({"a": a, "b": b}, repeats, warmup=1)
    return timings["a"].median * 1e3, timings["b"].median * 1e3


def time_steps(args: argparse.Namespace) -> None:
    """Each workload of STEPS in this process, F.linear and oneDNN in turn call by call (the order reversed
    every other pair), the gradients' products as the machine cache's decision names them: the host's slow
    spells fall on both routes alike."""
    decision = products.decided_here()
    from benchmarks import workloads

    print(f"\n{args.pairs} pairs of calls, each after an untimed one of its route; ms, median (quartiles)")
    print("| work | F.linear | oneDNN | speed-up, median of the pairs (range) |\n|---|---:|---:|---:|")
    for name in STEPS:
        work = workloads.WORKLOADS[name]()
        seconds: dict[bool, list[float]] = {False: [], True: []}
        for pair in range(args.pairs):
            for onednn in (False, True) if pair % 2 == 0 else (True, False):
                products.set_onednn(onednn, gram_mm=decision["gram_mm"], grad_mm=decision["grad_mm"])
                seconds[onednn].append(measure(work.run, 1, warmup=1).median)
        ratios = sorted(a / b for a, b in zip(seconds[False], seconds[True]))
        cells = []
        for timed in (summarise(seconds[False]), summarise(seconds[True])):
            q1, q3 = timed.quartiles
            cells.append(f"{timed.median * 1e3:,.0f} ({q1 * 1e3:,.0f}-{q3 * 1e3:,.0f})")
        print(f"| {work.about} | {cells[0]} | {cells[1]} | {statistics.median(ratios):.3f}x "
              f"({ratios[0]:.2f}-{ratios[-1]:.2f}) |", flush=True)
    products.set_onednn(decision["onednn"], gram_mm=decision["gram_mm"], grad_mm=decision["grad_mm"])


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("products", __doc__)
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="torch threads (default: as captioner.core.process_settings sets them)")
    parser.add_argument("--repeats", type=positive_int, default=20)
    parser.add_argument("--steps", action="store_true", help="time whole workloads with each route instead")
    parser.add_argument("--pairs", type=positive_int, default=None,
                        help="with --steps: timed calls of each route, in turn (default: 8)")
    args = parser.parse_args(argv)
    if args.pairs is not None and not args.steps:
        parser.error("--pairs applies only with --steps")
    args.pairs = args.pairs or 8
    set_threads(args.threads)
    if not products.onednn_enabled():
        print("products: this torch build has no oneDNN inner product (or CAPTIONER_ONEDNN=0)", file=sys.stderr)
        return 1
    print_environment(args)
    if args.steps:
        time_steps(args)
        return 0
    torch.manual_seed(0)
    print(f"fp32, median of {args.repeats} alternating calls; error: largest |difference| from float64")
    print("| product | M x K x N | torch (MKL) | oneDNN | speed-up | error torch / oneDNN |")
    print("|---|---|---:|---:|---:|---:|")
    for what, M, K, N, fresh in SHAPES:
        x, weight, bias = torch.randn(M, K), torch.randn(N, K) / K**0.5, torch.randn(N)
        exact = torch.addmm(bias.double(), x.double(), weight.double().t())

        def ours() -> torch.Tensor:
            if fresh:
                return products._product(x, products._reorder(weight), bias)
            return products.linear(x, weight, bias)  # inside the scope below: the weight reordered once

        def theirs() -> torch.Tensor:
            return F.linear(x, weight, bias)

        with torch.no_grad(), products.reused_weights():  # as in a decoding loop
            t_theirs, t_ours = alternating(theirs, ours, args.repeats)
            errors = [(f().double() - exact).abs().max().item() for f in (theirs, ours)]
        print(
            f"| {what} | {M} x {K} x {N} | {t_theirs:.2f} ms | {t_ours:.2f} ms | {t_theirs / t_ours:.2f}x "
            f"| {errors[0]:.1e} / {errors[1]:.1e} |"
        )
    print("\nbackward of the training products (x W^T: the input's gradient g W, the weight's g^T x)")
    print("| product | torch: g W + g^T x | oneDNN | speed-up |\n|---|---:|---:|---:|")
    for what, M, K, N, _ in SHAPES[5:7]:
        x, weight = torch.randn(M, K), torch.randn(N, K)
        g = torch.randn(M, N)

        def theirs_backward() -> None:
            g @ weight, g.t() @ x

        def ours_backward() -> None:
            products.prepared(weight.t())(g), products.gram(g, x)

        t_theirs, t_ours = alternating(theirs_backward, ours_backward, max(3, args.repeats // 4))
        print(f"| {what} | {t_theirs:.1f} ms | {t_ours:.1f} ms | {t_theirs / t_ours:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
