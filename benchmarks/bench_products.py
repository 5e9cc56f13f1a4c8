"""The dense layers' products: torch's own (MKL's sgemm for fp32) against oneDNN's inner product
with a reordered weight, alternating call by call. The shapes are the LSTM decoder's at COCO sizes,
with each route's error from float64; it decides the route of `captioner.models.products`.

    python -m benchmarks products [--repeats 20] [--threads N]
    python -m benchmarks products --steps [--rounds 4] [--step-repeats 5]

`--steps` times whole workloads instead (the LSTM train step and beam search of `benchmarks/workloads.py`),
each in fresh processes with the dense layers through F.linear and through oneDNN, alternating round by
round, the gradients' products as this machine decided them."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from captioner.core.process_settings import set_threads
from captioner.models import products

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.timing import alternate, argument_parser, measure, print_environment  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
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


def step_child(name: str, onednn: bool, repeats: int) -> dict:
    """In this process: workload `name` with the dense layers through oneDNN or F.linear, the gradients'
    products as this machine decided them, malloc as `--malloc` chose -> its median seconds and the route it took."""
    from captioner.core.allocator import keep_large_blocks

    keep_large_blocks()  # unless the parent's --malloc glibc said otherwise (CAPTIONER_MALLOC)
    decision = products.decided_here()
    products.set_onednn(onednn, gram_mm=decision["gram_mm"], grad_mm=decision["grad_mm"])
    from benchmarks import workloads

    work = workloads.WORKLOADS[name]()
    for _ in range(2):
        work.run()
    return {"seconds": measure(work.run, repeats, warmup=0).median, "onednn": products.route_taken(),
            "about": work.about}


def time_steps(args: argparse.Namespace) -> None:
    """Each workload of STEPS in fresh processes, F.linear and oneDNN alternating round by round."""
    print(f"\n{args.rounds} round(s), each a fresh process per route, {args.step_repeats} timed calls each (medians)")
    print("| work | F.linear | oneDNN | speed-up |\n|---|---:|---:|---:|")
    for name in STEPS:
        seconds: dict[bool, list[float]] = {False: [], True: []}
        about = name
        for round_ in range(args.rounds):
            for onednn in (False, True) if round_ % 2 == 0 else (True, False):
                command = [sys.executable, "-m", "benchmarks", "products", "--child", name, "--route",
                           "onednn" if onednn else "linear", "--step-repeats", str(args.step_repeats)]
                if args.threads:
                    command += ["--threads", str(args.threads)]
                done = subprocess.run(command, cwd=ROOT, env=os.environ.copy(), capture_output=True, text=True)
                if done.returncode != 0:
                    raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
                result = json.loads(done.stdout.splitlines()[-1])
                if result["onednn"] != onednn:
                    raise SystemExit(f"{name}: the child took the other route")
                seconds[onednn].append(result["seconds"])
                about = result["about"]
        linear_ms, onednn_ms = (statistics.median(seconds[route]) * 1e3 for route in (False, True))
        print(f"| {about} | {linear_ms:,.0f} ms | {onednn_ms:,.0f} ms | {linear_ms / onednn_ms:.3f}x |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("products", __doc__)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: as captioner.core.process_settings sets them)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--steps", action="store_true", help="time whole workloads with each route instead")
    parser.add_argument("--rounds", type=int, default=4, help="with --steps: processes of each route, alternating")
    parser.add_argument("--step-repeats", type=int, default=5, help="with --steps: timed calls in each process")
    parser.add_argument("--child", choices=STEPS, help=argparse.SUPPRESS)  # one process's measurement
    parser.add_argument("--route", choices=("onednn", "linear"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    set_threads(args.threads)
    if not products.onednn_enabled():
        print("products: this torch build has no oneDNN inner product (or CAPTIONER_ONEDNN=0)", file=sys.stderr)
        return 1
    if args.child:
        print(json.dumps(step_child(args.child, args.route == "onednn", args.step_repeats)))
        return 0
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
    sys.exit(main())
