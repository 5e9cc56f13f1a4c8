"""The feature store at scale on a CPU: a store of synthetic 7x7x1280 fp16 grids (50,000 by
default, 6.3 GB: the size of EfficientNet-Lite0 on 50k images), read at random by a training run
of the Flickr8k LSTM decoder through DataLoader workers, with the peak memory of the run.

    python -m benchmarks feature_store --dir /tmp/store_bench [--rows 50000] [--steps 200]

Prints read throughput (grids/s: sequential and random, from a cold and a warm page cache),
then trains the decoder for --steps steps on batches drawn at random from the store and reports
the peak resident memory of the main process and its workers (sampled from /proc every 0.2 s,
and resource.getrusage's maxima). The store is deleted at the end unless --keep. It is what
shows that the store's positional reads keep a run's memory flat at any store size.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

if not __package__:  # run as a file: the repository on the path, for the benchmarks package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing import argument_parser, print_environment  # noqa: E402
from captioner.core.config import load_config  # noqa: E402
from captioner.data.batching import CaptionDataset, collate_captions  # noqa: E402
from captioner.data.image_transform import ImageTransform  # noqa: E402
from captioner.data.records import ImageRecord  # noqa: E402
from captioner.data.store import (  # noqa: E402
    FORMAT,
    VERSION,
    FeatureStore,
    npy_header_bytes,
    size_text,
    store_files,
    write_manifest,
)
from captioner.models.build import build_model  # noqa: E402
from captioner.text.vocab import Vocabulary  # noqa: E402
from captioner.training.loop import caption_loss  # noqa: E402

GRID, DIM = (7, 7), 1280
WORDS = "a man woman dog cat child red blue green ball grass water street runs sits jumps on in the with".split()


def make_store(directory: Path, rows: int) -> FeatureStore:
    """A store in the format `captioner features` writes, filled with random fp16 grids
    (a 64 MB random block written over and over: real data blocks, not a sparse file)."""
    directory.mkdir(parents=True, exist_ok=True)
    array_path, manifest_path = store_files(directory, "train")
    shape = (rows, GRID[0] * GRID[1], DIM)
    np.lib.format.open_memmap(array_path, mode="w+", dtype=np.float16, shape=shape)
    header = npy_header_bytes(array_path)
    row_bytes = shape[1] * shape[2] * 2
    chunk = max(1, (64 << 20) // row_bytes)
    block = np.random.default_rng(0).standard_normal((chunk, *shape[1:]), dtype=np.float32).astype(np.float16)
    fd = os.open(array_path, os.O_WRONLY)
    try:
        for start in range(0, rows, chunk):
            count = min(chunk, rows - start)
            block[:, 0, 0] = np.arange(start, start + chunk, dtype=np.float16)  # rows differ
            os.pwrite(fd, block[:count].tobytes(), header + start * row_bytes)
        os.fsync(fd)
    finally:
        os.close(fd)
    manifest = {
        "format": FORMAT, "version": VERSION, "split": "train", "identity": {"synthetic": True},
        "grid": list(GRID), "feat_dim": DIM, "dtype": "float16", "shape": list(shape),
        "image_ids": list(range(rows)), "paths": [f"synthetic/{i}.jpg" for i in range(rows)],
        "rows_done": rows, "failed": [], "seconds": 0.0,
    }
    write_manifest(manifest_path, manifest)
    return FeatureStore(directory, "train", manifest)


def drop_cache(path: Path) -> None:
    """Evict this one file from the page cache (only it: other work on the machine keeps its cache)."""
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def throughput(store: FeatureStore, count: int, order: str) -> float:
    rows = list(range(store.num_rows))
    picked = random.Random(1).sample(rows, count) if order == "random" else rows[:count]
    reader = store.rows(picked)
    start = time.perf_counter()
    for i in range(len(reader)):
        reader[i]
    return count / (time.perf_counter() - start)


def rss_kb(pid: int, field: str) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup" if field == "Pss" else f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class MemorySampler(threading.Thread):
    """Peak of the summed RSS (and PSS, which counts shared pages once) of this process and its children."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_rss = self.peak_pss = 0
        self.stop = threading.Event()

    def run(self) -> None:
        me = os.getpid()
        while not self.stop.is_set():
            children = Path(f"/proc/{me}/task/{me}/children").read_text().split()
            pids = [me, *map(int, children)]
            self.peak_rss = max(self.peak_rss, sum(rss_kb(p, "VmRSS") for p in pids))
            self.peak_pss = max(self.peak_pss, sum(rss_kb(p, "Pss") for p in pids))
            self.stop.wait(0.2)


def train(store: FeatureStore, steps: int, batch_size: int, workers: int) -> dict:
    """The training step of `fit` (the same dataset, collation and loss) on random batches of the store."""
    rng = random.Random(0)
    captions = [(" ".join(rng.choices(WORDS, k=rng.randint(8, 14))),) for _ in range(store.num_rows)]
    records = [ImageRecord(i, Path(p), c) for i, (p, c) in enumerate(zip(store.manifest["paths"], captions))]
    vocab = Vocabulary.build(WORDS)
    # A small LSTM decoder: the data path is what is measured, and on a loaded CPU the full one
    # (hidden 512) takes seconds a step.
    config = load_config("configs/flickr8k_lstm_lite0.yaml", [
        "model.encoder.pretrained=false", "train.device=cpu", "model.decoder.embed_dim=64",
        "model.decoder.hidden_dim=128", "model.decoder.attention_dim=64",
    ])
    torch.manual_seed(0)
    model = build_model(config, vocab)
    model.train()
    dataset = CaptionDataset(records, vocab, ImageTransform(224), 25, "one", store.rows(list(range(store.num_rows))))
    sampler = torch.utils.data.RandomSampler(dataset, num_samples=steps * batch_size, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, collate_fn=collate_captions)
    optimizer = torch.optim.AdamW(model.decoder.parameters(), lr=1e-3)
    sampler_thread = MemorySampler()
    sampler_thread.start()
    losses, waits = [], 0.0
    start = time.perf_counter()
    fetched = time.perf_counter()
    for step, batch in enumerate(loader, 1):
        waits += time.perf_counter() - fetched
        loss, parts = caption_loss(model, batch, config, encoded=True)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(parts["loss"])
        if step % 25 == 0:
            print(f"  step {step}/{steps}  loss {np.mean(losses[-25:]):.3f}  peak rss (all processes) "
                  f"{sampler_thread.peak_rss / 2**20:.2f} GB", flush=True)
        fetched = time.perf_counter()
    seconds = time.perf_counter() - start
    sampler_thread.stop.set()
    sampler_thread.join()
    return {
        "steps": steps, "batch_size": batch_size, "workers": workers, "seconds": round(seconds, 1),
        "steps_per_s": round(steps / seconds, 2), "seconds_waiting_for_data": round(waits, 1),
        "loss_first_25": round(float(np.mean(losses[:25])), 3), "loss_last_25": round(float(np.mean(losses[-25:])), 3),
        "peak_rss_all_processes_gb": round(sampler_thread.peak_rss / 2**20, 3),
        "peak_pss_all_processes_gb": round(sampler_thread.peak_pss / 2**20, 3),
        "maxrss_main_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
        "maxrss_largest_worker_gb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 3),
    }


def memmap_contrast(store: FeatureStore, count: int) -> dict:
    """What the store's positional reads avoid: reading the same random rows through np.memmap
    maps each touched page into the reader, and its resident size grows with them."""
    before = rss_kb(os.getpid(), "VmRSS")
    array = np.load(store.array_path, mmap_mode="r")
    for row in random.Random(2).sample(range(store.num_rows), count):
        torch.from_numpy(np.array(array[row]))
    grown = rss_kb(os.getpid(), "VmRSS") - before
    del array
    before = rss_kb(os.getpid(), "VmRSS")
    reader = store.rows(random.Random(2).sample(range(store.num_rows), count))
    for i in range(len(reader)):
        reader[i]
    return {"rows": count, "memmap_rss_growth_gb": round(grown / 2**20, 3),
            "pread_rss_growth_gb": round((rss_kb(os.getpid(), "VmRSS") - before) / 2**20, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser("feature_store", __doc__)
    parser.add_argument("--dir", required=True, help="folder for the synthetic store (deleted at the end)")
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--read-count", type=int, default=5000, help="grids per throughput measurement")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print_environment(args)
    directory = Path(args.dir)
    need = args.rows * GRID[0] * GRID[1] * DIM * 2
    free = shutil.disk_usage(directory.parent if not directory.exists() else directory).free
    print(f"store: {args.rows} x {GRID[0]}x{GRID[1]} x {DIM} fp16 = {size_text(need)} in {directory} ({size_text(free)} free)")
    if need > free:
        print("feature_store: not enough disk space", file=sys.stderr)
        return 1
    report: dict = {"rows": args.rows, "bytes": need}
    try:
        start = time.perf_counter()
        store = make_store(directory, args.rows)
        report["write_seconds"] = round(time.perf_counter() - start, 1)
        print(f"written in {report['write_seconds']} s")
        for order in ("sequential", "random"):
            drop_cache(store.array_path)
            report[f"{order}_cold_grids_per_s"] = round(throughput(store, args.read_count, order))
            report[f"{order}_warm_grids_per_s"] = round(throughput(store, args.read_count, order))
            print(f"{order}: {report[f'{order}_cold_grids_per_s']} grids/s cold, {report[f'{order}_warm_grids_per_s']} warm")
        drop_cache(store.array_path)
        print(f"training the LSTM decoder {args.steps} steps on random batches of {args.batch_size}, {args.workers} workers")
        report["train"] = train(store, args.steps, args.batch_size, args.workers)
        report["memmap_contrast"] = memmap_contrast(store, min(args.rows, 20_000))
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
