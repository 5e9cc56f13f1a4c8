"""Flickr8k's training photos streamed as WebDataset shards, from local disk and from a loopback
HTTP server, against the image-folder loader (the same photos read file by file), and the
training step the loader has to keep fed.

    python benchmarks/bench_stream.py [--shards runs/bench_stream] [--images 6000] [--batches 40]

The shards are written once into --shards (`captioner data shards`' writer, 500 photos a shard)
and served by `python -m http.server` in another process. Each row times `--batches` batches of
32 photos at 224 px with the training transform, through the real loaders (`ShardStream`, and the
DataLoader over `CaptionDataset` that a local dataset uses), after their first batch (worker start
and the first shard's opening are reported apart). Images per second per core is the 1-worker
row: one worker is one core. The step row is the Flickr8k config's training step with the encoder
run on the pixels, as a streamed run does (the feature store is for local datasets), on the
machine's threads; the loader keeps it fed when its images per second exceed the step's.
Wall seconds: name the processor (`lscpu`) and what else ran beside them.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import torch
from shared_data import SHARED_DATA
from torch.utils.data import DataLoader

from captioner.core.config import load_config
from captioner.data.batching import CaptionBatch, CaptionDataset, collate_captions
from captioner.data.flickr8k import load_flickr8k
from captioner.data.images import ImageTransform
from captioner.data.sampler import EpochBatchSampler
from captioner.data.shards import INDEX, write_shards
from captioner.data.streaming import ShardStream, StreamingCaptions, StreamSettings, open_shard_set
from captioner.models.build import build_model
from captioner.text.vocab import Vocabulary
from captioner.training.loop import caption_loss
from captioner.training.schedule import make_optimizer

ROOT = Path(__file__).resolve().parent.parent
BATCH = 32


def timed(batches: Iterable[CaptionBatch], count: int) -> tuple[float, float]:
    """(seconds to the first batch, images per second over the next `count` batches)."""
    start = time.perf_counter()
    iterator = iter(batches)
    next(iterator)
    first = time.perf_counter() - start
    start, images = time.perf_counter(), 0
    for _ in range(count):
        images += len(next(iterator).indices)
    return first, images / (time.perf_counter() - start)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=Path, default=ROOT / "runs" / "bench_stream", help="where the shards are written once")
    parser.add_argument("--images", type=int, default=6000, help="training photos (Flickr8k's train split has 6,000)")
    parser.add_argument("--batches", type=int, default=40, help="batches of 32 timed per row")
    parser.add_argument("--workers", default="1,2", help="loader workers to time (comma-separated)")
    args = parser.parse_args()

    records = load_flickr8k(SHARED_DATA / "flickr8k", "train", SHARED_DATA / "flickr8k_224" / "images")[: args.images]
    folder = args.shards / "train"
    if not (folder / INDEX).exists():
        summary = write_shards(records, folder, max_count=500, description="writing shards")
        print(f"wrote {len(summary.shards)} shards of {summary.samples} photos into {folder}")
    shards_mb = sum(p.stat().st_size for p in folder.glob("*.tar")) / 1e6
    pattern = str(folder / f"{{00000..{len(list(folder.glob('*.tar'))) - 1:05d}}}.tar")
    config = load_config(ROOT / "configs" / "flickr8k_lstm_lite0.yaml")
    vocab = Vocabulary.build((c for r in records for c in r.captions), config.data.min_word_count)
    transform = ImageTransform(config.data.image_size, train=True)
    print(f"{len(records)} photos, {shards_mb:.0f} MB of shards; {len(os.sched_getaffinity(0))} cores, "
          f"load average {os.getloadavg()[0]:.1f} at the start; torch threads {torch.get_num_threads()}")

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(args.shards)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        url_pattern = f"http://127.0.0.1:{port}/train/" + pattern.rsplit("/", 1)[1]
        rows = []
        for workers in (int(w) for w in args.workers.split(",")):
            folder_set = CaptionDataset(records, vocab, transform, config.data.max_caption_length, "all")
            sampler = EpochBatchSampler(len(folder_set), BATCH, seed=0)
            loader = DataLoader(folder_set, batch_sampler=sampler, num_workers=workers, collate_fn=collate_captions)
            rows.append(("image folder (files)", workers, *timed(loader, args.batches)))
            for name, source in (("shards, local disk", pattern), ("shards, loopback HTTP", url_pattern)):
                settings = StreamSettings(0, 0, 1, workers, BATCH, 0.01, 1000, config.data.max_caption_length, "all")
                stream = ShardStream(StreamingCaptions(open_shard_set(source, name), vocab, transform, settings))
                stream.set_epoch(1)
                rows.append((name, workers, *timed(stream, args.batches)))
    finally:
        server.terminate()

    model = build_model(config, vocab)
    optimizer = make_optimizer(model, config, 1.0)
    batch = next(iter(DataLoader(CaptionDataset(records[:BATCH], vocab, transform, config.data.max_caption_length, "all"),
                                 batch_size=BATCH, collate_fn=collate_captions)))
    times = []
    for _ in range(4):
        start = time.perf_counter()
        loss, _ = caption_loss(model, batch, config, encoded=False)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    step = sorted(times[1:])[1]  # the median of the three after the first
    print(f"load average {os.getloadavg()[0]:.1f} at the end\n")
    print("| loader | workers | first batch (s) | images/s | images/s per worker |")
    print("|---|---:|---:|---:|---:|")
    for name, workers, first, rate in rows:
        print(f"| {name} | {workers} | {first:.1f} | {rate:.0f} | {rate / workers:.0f} |")
    print(f"| training step (Lite0 on the pixels + LSTM, batch {BATCH}, {torch.get_num_threads()} threads) | | | {BATCH / step:.1f} | |")
    slowest = min(rate for _, _, _, rate in rows)
    print(f"\nthe slowest loader row gives {slowest:.0f} images/s, the step takes {BATCH / step:.1f}: "
          f"{'fed' if slowest > BATCH / step else 'NOT fed'} ({slowest / (BATCH / step):.1f}x)")


if __name__ == "__main__":
    main()
