"""The training step of a shapes config at several widths of its small CNN, side by side.

One process builds one model per width, with the same vocabulary, and takes the same batches
through each in turn (loss, backward and the optimiser's step, as `profile_step.py` times them),
round after round. A busy moment then costs every width alike. It prints the median seconds per
step of each and its speed against the first width. What a width costs
in captions and attention is measured by training, not here: docs/benchmarks.md ("The
quickstart on the Zen 3") has the runs.

    python benchmarks/bench_widths.py [--config configs/shapes_lstm.yaml] [--widths 32 24 16] [--steps 4] [--rounds 5] [--threads N]

Name the processor (`lscpu`) and what else was running beside what it prints.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_cpu_amp import ROOT, config_batches, training_step

from captioner.core.config import load_config
from captioner.core.runtime import set_threads
from captioner.models.build import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "shapes_lstm.yaml"))
    parser.add_argument("--widths", type=int, nargs="+", default=[32, 24, 16], help="model.encoder.width of each model; the first is the reference")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per width and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: captioner.core.runtime's)")
    args = parser.parse_args()
    if any(w < 1 for w in args.widths) or args.steps < 1 or args.rounds < 1:
        parser.error("--widths, --steps and --rounds must be positive")
    threads = set_threads(args.threads)
    _, vocab, batches = config_batches(args.config, args.steps + 2)
    models = {}
    for width in args.widths:
        config = load_config(args.config, [f"model.encoder.width={width}", "train.device=cpu"])
        if config.model.encoder.name != "small_cnn":
            parser.error(f"{args.config}: model.encoder.name is {config.model.encoder.name}; the widths are the small CNN's")
        torch.manual_seed(0)
        model = build_model(config, vocab).train()
        models[width] = (config, model, torch.optim.AdamW(model.parameters(), lr=1e-4))

    for config, model, optimizer in models.values():  # warm-up: first-use calibration, allocator, oneDNN primitives
        for batch in batches[:2]:
            training_step(model, optimizer, config, batch)
    seconds: dict[int, list[float]] = {width: [] for width in models}
    for _ in range(args.rounds):
        for width, (config, model, optimizer) in models.items():
            start = time.perf_counter()
            for batch in batches[2:]:
                training_step(model, optimizer, config, batch)
            seconds[width].append((time.perf_counter() - start) / args.steps)
    data = load_config(args.config).data
    print(f"{args.config}: training step, batch {data.batch_size}, {data.image_size} px, {threads} threads, "
          f"median of {args.rounds} rounds of {args.steps} steps")
    reference = statistics.median(seconds[args.widths[0]])
    for width, times in seconds.items():
        median = statistics.median(times)
        print(f"  width {width:3d}: {median:.3f} s a step ({min(times):.3f}-{max(times):.3f}), "
              f"{reference / median:.2f}x width {args.widths[0]}'s")


if __name__ == "__main__":
    main()
