"""Threads on a small shared machine: training steps with 1 and 2 torch threads, alone and against
an identical competing process. Each is a fresh process, rounds alternating; it decides
`train.threads: 0` (captioner/core/process_settings.py): the free cores, not all."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from captioner.apps.arguments import positive_int
from captioner.core.config_sections import thread_count

ROOT = Path(__file__).resolve().parent.parent
if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(ROOT))
from benchmarks.timing import argument_parser, print_environment, run_main, summarise  # noqa: E402


def worker(config_path: str, steps: int, threads: int) -> None:
    import torch
    from torch.utils.data import DataLoader

    from captioner.core.config import load_config
    from captioner.core.process_settings import set_threads
    from captioner.data.batching import CaptionDataset, collate_captions
    from captioner.data.datasets import load_split
    from captioner.data.image_transform import ImageTransform
    from captioner.models.captioner import Captioner
    from captioner.text.vocab import Vocabulary
    from captioner.training.loop import caption_loss

    set_threads(threads)
    torch.manual_seed(0)
    config = load_config(config_path, ["train.device=cpu"])
    data = config.data
    records = load_split(data, "train")[: data.batch_size * (steps + 1)]
    vocab = Vocabulary.build((c for r in records for c in r.captions), data.min_word_count)
    model = Captioner.from_config(config, vocab).train()
    dataset = CaptionDataset(records, vocab, ImageTransform(data.image_size, train=True), data.max_caption_length,
                             data.captions_per_image)
    batches = list(DataLoader(dataset, batch_size=data.batch_size, collate_fn=collate_captions))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch) -> None:
        loss, _ = caption_loss(model, batch, config, encoded=False)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    step(batches[0])
    start = time.perf_counter()
    for batch in batches[1:]:
        step(batch)
    print(f"{(time.perf_counter() - start) / (len(batches) - 1):.4f}")


def run(config: str, steps: int, threads: int, copies: int) -> list[float]:
    command = [sys.executable, __file__, "--worker", "--config", config, "--steps", str(steps), "--threads",
               str(threads)]
    env = {"OMP_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    procs = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ, **env})
             for _ in range(copies)]
    outputs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("bench_threads: a worker failed")
    return [float(o.strip().splitlines()[-1]) for o in outputs]


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("threads", __doc__)
    parser.add_argument("--config", default=str(ROOT / "configs" / "shapes_lstm.yaml"))
    parser.add_argument("--steps", type=positive_int, default=8)
    parser.add_argument("--rounds", type=positive_int, default=2)
    parser.add_argument("--threads", type=thread_count, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.config, args.steps, args.threads)
        return 0
    from captioner.core.config import load_config
    from captioner.data.datasets import load_split

    load_split(load_config(args.config, ["train.device=cpu"]).data, "train")  # a mistake: one line, before workers
    print_environment(args)
    settings = [(1, 1), (2, 1), (1, 2), (2, 2)]  # (threads, processes at once)
    results: dict[tuple[int, int], list[float]] = {s: [] for s in settings}
    for r in range(args.rounds):
        for s in settings if r % 2 == 0 else reversed(settings):
            results[s] += run(args.config, args.steps, *s)
            print(f"round {r + 1}: {s[0]} thread(s), {s[1]} process(es): {results[s][-s[1]:]} s/step", flush=True)
    print(f"{Path(args.config).name}: seconds per training step (median over rounds and processes)")
    print("| threads per process | alone | against one competing process | slowdown |\n|---:|---:|---:|---:|")
    for threads in (1, 2):
        alone, shared = summarise(results[(threads, 1)]), summarise(results[(threads, 2)])
        print(f"| {threads} | {alone} | {shared} | {shared.median / alone.median:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
