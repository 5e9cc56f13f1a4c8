"""What the checkpoint checksum costs: writing and reading a checkpoint-sized payload with and
without it, alternating the two so that machine load hits both alike.

    python benchmarks/bench_checksums.py --mb 400 --store-mb 2000 --repeats 3

Prints, for a payload of --mb megabytes of float32 tensors (a COCO LSTM checkpoint with its
Adam state is a few hundred MB): the median time of plain torch.save, of torch.save and fsync,
and of `write_checkpoint_file` (torch.save, sha256 of the file, its comment, fsync, rename), of plain
torch.load and of `read_checkpoint` (one streamed sha256 pass, then torch.load), and the
hashing throughput alone (sha256 of the file in 1 MiB blocks). Then the check a feature store
gets when it is opened (`store.check_array`: its chunks hashed on up to 8 threads) on a
synthetic store of --store-mb megabytes (7x7x1280 fp16 rows, chunks of 64 rows), beside one
sequential sha256 of the same file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import hashlib

import numpy as np

from captioner.core.checksums import sha256_of
from captioner.data.store import FORMAT, VERSION, FeatureStore, check_array
from captioner.models.checkpoint_format import FORMAT_VERSION, read_checkpoint, write_checkpoint_file


def seconds(action) -> float:  # noqa: ANN001 - any callable
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def save_and_sync(payload: dict, path: Path) -> None:
    """torch.save, then on the disk (write_checkpoint_file fsyncs before its rename)."""
    torch.save(payload, path)
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=400, help="payload size in MB (default 400)")
    parser.add_argument("--store-mb", type=int, default=2000, help="feature store size in MB (default 2000; 0: skip)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(0)
    rows = args.mb * (1 << 20) // 4 // 1024
    payload = {
        "format_version": FORMAT_VERSION, "config": {}, "vocab": ["<pad>"],
        "model": {f"w{i}": torch.randn(rows // 8, 1024) for i in range(8)},  # (rows/8, 1024) float32 each
    }
    names = ("torch.save", "torch.save + fsync", "write_checkpoint_file", "torch.load", "read_checkpoint", "sha256")
    times: dict[str, list[float]] = {k: [] for k in names}
    with tempfile.TemporaryDirectory() as folder:
        plain, checked = Path(folder) / "plain.pt", Path(folder) / "checked.pt"
        for _ in range(args.repeats):
            times["torch.save"].append(seconds(lambda: torch.save(payload, plain)))
            times["torch.save + fsync"].append(seconds(lambda: save_and_sync(payload, plain)))
            times["write_checkpoint_file"].append(seconds(lambda: write_checkpoint_file(payload, checked)))
            times["torch.load"].append(seconds(lambda: torch.load(plain, map_location="cpu", weights_only=True)))
            times["read_checkpoint"].append(seconds(lambda: read_checkpoint(checked)))
            times["sha256"].append(seconds(lambda: sha256_of(checked)))
        size = checked.stat().st_size
    print(f"payload {size / 1e6:.0f} MB, median of {args.repeats} (alternating)")
    median = {k: statistics.median(v) for k, v in times.items()}
    for name, value in median.items():
        print(f"  {name:<22} {value:6.3f} s")
    print(f"  write with checksum / torch.save + fsync: {median['write_checkpoint_file'] / median['torch.save + fsync']:.2f}x")
    print(f"  read with checksum / plain torch.load:  {median['read_checkpoint'] / median['torch.load']:.2f}x")
    print(f"  sha256 throughput: {size / 1e6 / median['sha256']:.0f} MB/s")
    if args.store_mb:
        store_check(args.store_mb, args.repeats)


def store_check(megabytes: int, repeats: int) -> None:
    """check_array on a synthetic store, beside one sequential sha256 of its file."""
    cells, dim, chunk = 49, 1280, 64
    row_bytes = cells * dim * 2
    rows = megabytes * 1_000_000 // row_bytes
    with tempfile.TemporaryDirectory() as folder:
        array_path = Path(folder) / "train.npy"
        array = np.lib.format.open_memmap(array_path, mode="w+", dtype=np.float16, shape=(rows, cells, dim))
        checksums = []
        rng = np.random.default_rng(0)
        for first in range(0, rows, chunk):
            block = rng.standard_normal((min(chunk, rows - first), cells, dim), dtype=np.float32).astype(np.float16)
            array[first : first + len(block)] = block
            checksums.append([first, len(block), hashlib.sha256(block.tobytes()).hexdigest()])
        array.flush()
        del array
        manifest = {"format": FORMAT, "version": VERSION, "split": "train", "grid": [7, 7], "feat_dim": dim, "dtype": "float16",
                    "shape": [rows, cells, dim], "image_ids": list(range(rows)), "rows_done": rows, "checksums": checksums}
        store = FeatureStore(folder, "train", manifest)
        check, plain = [], []
        for _ in range(repeats):
            check.append(seconds(lambda: check_array(store)))
            plain.append(seconds(lambda: sha256_of(array_path)))
        size = array_path.stat().st_size
    print(f"feature store {size / 1e6:.0f} MB ({rows} rows), median of {repeats} (alternating, file in the page cache)")
    print(f"  check_array (threads)  {statistics.median(check):6.3f} s  ({size / 1e6 / statistics.median(check):.0f} MB/s)")
    print(f"  one sequential sha256  {statistics.median(plain):6.3f} s  ({size / 1e6 / statistics.median(plain):.0f} MB/s)")


if __name__ == "__main__":
    main()
