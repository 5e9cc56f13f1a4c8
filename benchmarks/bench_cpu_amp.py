"""The quickstart's training step in fp32 and under bf16 autocast (`train.cpu_amp`), side by side,
and what `train.cpu_amp: auto`'s calibration decides for the same shapes. It should name the faster
real step; both train the same weights on the same shapes batches, alternating by round."""

from __future__ import annotations

import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from captioner.apps.arguments import positive_int
from captioner.core.config import load_config
from captioner.core.process_settings import cpu_has_native_bf16, set_threads
from captioner.data.batching import CaptionDataset, collate_captions
from captioner.data.datasets import load_split
from captioner.data.image_transform import ImageTransform
from captioner.data.shapes import generate_shapes
from captioner.core.config_sections import thread_count
from captioner.models.captioner import Captioner
from captioner.text.vocab import Vocabulary
from captioner.training.speed import time_precisions

ROOT = Path(__file__).resolve().parent.parent
if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(ROOT))
from benchmarks.timing import argument_parser, print_environment, run_main, summarise  # noqa: E402
from benchmarks.workloads import training_step  # noqa: E402


def config_batches(config_path: str, count: int) -> tuple[Any, Vocabulary, list[Any]]:
    """The config (on the CPU), the vocabulary and `count` training batches of a shapes world
    drawn into a temporary folder, as the config's loader makes them."""
    with tempfile.TemporaryDirectory() as folder:
        config = load_config(config_path, [f"data.root={folder}", "train.device=cpu"])
        data = config.data
        generate_shapes(folder, data.batch_size * count, 1, 1, image_size=data.image_size, progress=False)
        records = load_split(data, "train")
        vocab = Vocabulary.build((c for r in records for c in r.captions), data.min_word_count)
        dataset = CaptionDataset(records, vocab, ImageTransform(data.image_size, train=True), data.max_caption_length,
                                 data.captions_per_image)
        return config, vocab, list(DataLoader(dataset, batch_size=data.batch_size, collate_fn=collate_captions))


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("cpu_amp", __doc__)
    parser.add_argument("--config", default=str(ROOT / "configs" / "shapes_lstm.yaml"))
    parser.add_argument("--steps", type=positive_int, default=6, help="timed steps per variant and round")
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="torch threads (default: as captioner.core.process_settings sets them)")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    print_environment(args)
    native = cpu_has_native_bf16()
    if not native:
        print("train.cpu_amp auto takes fp32 on this CPU (bf16 would be emulated); timing it anyway")

    config, vocab, batches = config_batches(args.config, args.steps + 1)
    data = config.data
    torch.manual_seed(0)
    first = Captioner.from_config(config, vocab).train()
    variants = {}
    for name, bf16 in (("fp32", False), ("bf16 autocast", True)):
        model = copy.deepcopy(first)
        variants[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4), bf16)

    def epoch(name: str) -> tuple[float, float]:
        """Seconds per step over the batches after the first, and the last loss."""
        model, optimizer, bf16 = variants[name]
        start, loss = 0.0, 0.0
        for i, batch in enumerate(batches):
            if i == 1:
                start = time.perf_counter()
            loss = training_step(model, optimizer, config, batch, bf16)
        return (time.perf_counter() - start) / (len(batches) - 1), loss

    seconds: dict[str, list[float]] = {name: [] for name in variants}
    losses: dict[str, float] = {}
    for _ in range(args.rounds):
        for name in variants:
            step, losses[name] = epoch(name)
            seconds[name].append(step)
    print(f"\n{config.model.encoder.name} + {config.model.decoder.type}, {data.image_size} px, "
          f"batch {data.batch_size} images ({data.captions_per_image} captions each), "
          f"{args.steps} steps x {args.rounds} rounds")
    print("| variant | s/step | last loss |\n|---|---:|---:|")
    for name in variants:
        print(f"| {name} | {summarise(seconds[name])} | {losses[name]:.4f} |")
    ratio = summarise(seconds["fp32"]).median / summarise(seconds["bf16 autocast"]).median
    print(f"bf16 autocast is {ratio:.2f}x the fp32 step's speed")
    decision = time_precisions(first, config, False, None)
    print("the calibration (train.cpu_amp auto, synthetic batches of these shapes): "
          f"bf16 {decision['bf16_ms']:.1f} ms, "
          f"fp32 {decision['fp32_ms']:.1f} ms a pass: {'bf16' if decision['bf16'] else 'fp32'}"
          f"{'' if native else ' (not taken here: no native bf16)'}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
