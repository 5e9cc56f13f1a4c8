"""Where the quickstart's training step spends its time on this processor: `torch.profiler` over
a few fp32 steps of a config (default `configs/shapes_lstm.yaml`), the operators by their own CPU
time, and the seconds per step without the profiler beside it.

    python benchmarks/profile_step.py [--config configs/shapes_lstm.yaml] [--steps 8] [--threads N] [--top 15]

Run it on an idle machine and name the processor (`lscpu`) beside what it prints: issue 29 asks
for a profile, not a guess, wherever a speed goal is missed.
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_cpu_amp import ROOT, config_batches, training_step

from captioner.core.runtime import set_threads
from captioner.models.build import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "shapes_lstm.yaml"))
    parser.add_argument("--steps", type=int, default=8, help="profiled steps (and as many timed without the profiler)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: captioner.core.runtime's)")
    parser.add_argument("--top", type=int, default=15, help="operators listed")
    args = parser.parse_args()
    threads = set_threads(args.threads)
    config, vocab, batches = config_batches(args.config, args.steps + 2)
    torch.manual_seed(0)
    model = build_model(config, vocab).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch) -> None:
        training_step(model, optimizer, config, batch)

    for batch in batches[:2]:  # warm-up: first-use calibration, allocator, oneDNN primitives
        step(batch)
    start = time.perf_counter()
    for batch in batches[2:]:
        step(batch)
    seconds = (time.perf_counter() - start) / args.steps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        for batch in batches[2:]:
            step(batch)
    data = config.data
    print(f"{config.model.encoder.name} + {config.model.decoder.type}, {data.image_size} px, batch {data.batch_size}, "
          f"{threads} threads: {seconds:.3f} s per step without the profiler\n")
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=40))


if __name__ == "__main__":
    main()
