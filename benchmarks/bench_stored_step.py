"""The training step of a config that trains from a feature store (the Flickr8k and COCO configs):
seconds per step, and with `--profile` where they go. The batches are the config's own; random fp16
grids of the encoder's shape stand in for the store's rows (a step's cost depends on their shape)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from captioner.apps.arguments import nonnegative_int, positive_int
from captioner.core.config import load_config
from captioner.core.process_settings import set_threads
from captioner.data.batching import CaptionDataset, collate_captions
from captioner.data.datasets import load_split
from captioner.data.image_transform import ImageTransform
from captioner.data.store_extract import output_grid
from captioner.core.config_sections import thread_count
from captioner.models.captioner import Captioner
from captioner.text.vocab import Vocabulary

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_cpu_amp import ROOT  # noqa: E402
from benchmarks.timing import argument_parser, print_environment, run_main, summarise  # noqa: E402
from benchmarks.workloads import training_step  # noqa: E402


class RandomGrids:
    """Row i: a (N, D) fp16 grid, the same for the same i, as a store's row would be."""

    def __init__(self, count: int, cells: int, width: int) -> None:
        self.count, self.cells, self.width = count, cells, width

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(i)
        return torch.randn(self.cells, self.width, generator=generator).half()  # (N, D)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("stored_step", __doc__)
    parser.add_argument("--config", default=str(ROOT / "configs" / "flickr8k_lstm_lite0.yaml"))
    parser.add_argument("--steps", type=positive_int, default=6, help="timed steps per round")
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="torch threads (default: captioner.core.process_settings's)")
    parser.add_argument("--profile", type=nonnegative_int, default=0, metavar="N",
                        help="then profile the steps and list the N costliest operators")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. data.root=data/flickr8k")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    print_environment(args)
    config = load_config(args.config, [*args.overrides, "train.device=cpu", "model.encoder.pretrained=false"])
    data = config.data
    records = load_split(data, "train", check_images=False)
    vocab = Vocabulary.build((c for r in records for c in r.captions), data.min_word_count)
    torch.manual_seed(0)
    model = Captioner.from_config(config, vocab, load_pretrained=False).train()
    h, w = output_grid(model.encoder, data.image_size)
    width = model.encoder.out_dim
    grids = RandomGrids(len(records), h * w, width)
    dataset = CaptionDataset(records, vocab, ImageTransform(data.image_size), data.max_caption_length,
                             data.captions_per_image, grids)
    loader = DataLoader(dataset, batch_size=data.batch_size, shuffle=True, collate_fn=collate_captions,
                        generator=torch.Generator().manual_seed(0))
    batches = iter(loader)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    first = next(batches)
    print(
        f"{args.config}: {config.model.decoder.type} decoder, grids {h}x{w}x{width} fp16, "
        f"vocabulary {len(vocab)}, {len(first.indices)} images and {len(first.lengths)} captions a batch"
    )

    def step() -> None:
        training_step(model, optimizer, config, next(batches), encoded=True)

    for _ in range(2):  # warm-up: first-use calibration, allocator, oneDNN primitives
        step()
    rounds = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        rounds.append((time.perf_counter() - start) / args.steps)
    timing = summarise(rounds)
    print(f"seconds a step: {timing} (rounds of {args.steps} steps); "
          f"an epoch of {len(loader)} steps: {timing.median * len(loader) / 60:.1f} min")
    if args.profile:
        with torch.profiler.profile() as profile:
            for _ in range(args.steps):
                step()
        print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
