"""Reading a finished feature store: `open_store` checks it whole, `StoreRows` reads its rows. A row is one
`os.pread`, so pages stay in the shared page cache, not in each worker's memory as a memmap's would."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from captioner.core.errors import FeatureStoreError
from captioner.core.process_settings import loader_workers
from captioner.data.image_transform import ImageTransform
from captioner.data.records import ImageRecord
from captioner.data.store_format import (DTYPE, StoreEncoder, check_manifest, identity, npy_header, read_manifest,
                                          store_files)

log = logging.getLogger(__name__)


class FeatureStore:
    """One split's store on disk, its manifest checked against an encoder and a list of images."""

    def __init__(self, directory: str | Path, split: str, manifest: dict[str, Any]) -> None:
        self.array_path, self.manifest_path = store_files(directory, split)
        self.split = split
        self.manifest = manifest
        self.grid: tuple[int, int] = tuple(manifest["grid"])  # type: ignore[assignment]
        self.num_cells = self.grid[0] * self.grid[1]
        self.feat_dim: int = manifest["feat_dim"]
        self.num_rows = len(manifest["image_ids"])
        self.row_bytes = self.num_cells * self.feat_dim * np.dtype(DTYPE).itemsize
        self.header_bytes = npy_header(self.array_path)[2]

    @property
    def complete(self) -> bool:
        return self.manifest["rows_done"] == self.num_rows

    @property
    def failed_rows(self) -> set[int]:
        return {f["row"] for f in self.manifest["failed"]}

    def rows_of(self, records: list[ImageRecord]) -> tuple[list[ImageRecord], list[int]]:
        """The records whose image was stored (failed ones are left out) and their rows."""
        row_of = {image_id: row for row, image_id in enumerate(self.manifest["image_ids"])}
        failed = self.failed_rows
        kept = [(r, row_of[r.image_id]) for r in records if row_of[r.image_id] not in failed]
        return [r for r, _ in kept], [row for _, row in kept]

    def rows(self, rows: list[int]) -> StoreRows:
        return StoreRows(self.array_path, self.header_bytes, (self.num_cells, self.feat_dim), rows)

    def load(self, rows: list[int], device: torch.device) -> torch.Tensor:
        """The rows as one fp16 tensor (len(rows), N, D) on `device`, through the host a chunk at a time."""
        out = torch.empty(len(rows), self.num_cells, self.feat_dim, dtype=torch.float16, device=device)  # (R, N, D)
        reader = self.rows(rows)
        chunk = max(1, (64 << 20) // self.row_bytes)  # 64 MB at a time
        for start in range(0, len(rows), chunk):
            out[start : start + chunk] = reader[start : start + chunk].to(device)  # (chunk, N, D)
        return out

    def nbytes(self) -> int:
        return self.header_bytes + self.num_rows * self.row_bytes


def check_array(store: FeatureStore) -> FeatureStore:
    """The store, its array checked against its manifest: shape, dtype, size and every chunk's sha256."""
    manifest, array_path = store.manifest, store.array_path
    hint = f"run `captioner features CONFIG` again after deleting {array_path} and {store.manifest_path.name}"
    shape, dtype, _ = npy_header(array_path)
    if list(shape) != list(manifest["shape"]) or dtype != np.dtype(DTYPE):
        raise FeatureStoreError(f"{array_path}: holds {dtype} {tuple(shape)}, but {store.manifest_path.name} records "
                                f"{manifest['dtype']} {tuple(manifest['shape'])}; {hint}")
    expected_bytes, found_bytes = store.nbytes(), array_path.stat().st_size
    if found_bytes < expected_bytes:
        raise FeatureStoreError(f"{array_path}: {found_bytes} bytes, {expected_bytes} expected (truncated); {hint}")
    chunks = manifest.get("checksums")
    if chunks is None:
        log.warning("%s: written without checksums (by an earlier version): it cannot be checked for damage",
                    array_path)
        return store
    fd = os.open(array_path, os.O_RDONLY)
    try:
        def digest(chunk: list) -> str:
            first, count, _ = chunk
            return range_sha256(fd, store.header_bytes + first * store.row_bytes, count * store.row_bytes)

        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:  # sha256 releases the GIL
            for (first, count, recorded), found in zip(chunks, pool.map(digest, chunks)):
                if found != recorded:
                    raise FeatureStoreError(f"{array_path}: rows {first}-{first + count - 1} differ from the sha256 "
                                            f"recorded when they were written (the file is damaged or altered); {hint}")
    finally:
        os.close(fd)
    return store


def range_sha256(fd: int, offset: int, length: int) -> str:
    """The sha256 of `length` bytes of the open file `fd` from `offset`, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    end = offset + length
    while offset < end:
        block = os.pread(fd, min(end - offset, 1 << 20), offset)
        if not block:  # cut short since its size was checked: the digest differs
            break
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()


def existing_store(directory: str | Path, split: str, encoder: StoreEncoder, transform: ImageTransform,
                   records: list[ImageRecord]) -> FeatureStore | None:
    """`split`'s store with its manifest checked against the encoder, its transform and `records` (its array
    is not: `check_array`); None when its manifest or its array is missing."""
    array_path, manifest_path = store_files(directory, split)
    if not manifest_path.is_file() or not array_path.is_file():
        return None
    manifest = read_manifest(manifest_path)
    check_manifest(manifest_path, manifest, identity(encoder, transform), records)
    return FeatureStore(directory, split, manifest)


def open_store(directory: str | Path, split: str, encoder: StoreEncoder, transform: ImageTransform,
               records: list[ImageRecord]) -> FeatureStore:
    """The complete store of `split`, checked against the encoder, its transform and `records`."""
    store = existing_store(directory, split, encoder, transform, records)
    if store is None:
        raise FeatureStoreError(f"{store_files(directory, split)[1]}: no feature store for {split} here "
                                "(make it with `captioner features CONFIG`)")
    if not store.complete:
        raise FeatureStoreError(f"{store.manifest_path}: extraction stopped at row {store.manifest['rows_done']} of "
                                f"{store.num_rows}; run `captioner features CONFIG` again to finish it")
    return check_array(store)


class StoreRows:
    """Rows of a store read on demand, the file opened once per process (each DataLoader worker its own)."""

    def __init__(self, path: Path, header: int, row_shape: tuple[int, int], rows: list[int]) -> None:
        self.path = path
        self.header = header
        self.row_shape = row_shape
        self.row_bytes = row_shape[0] * row_shape[1] * np.dtype(DTYPE).itemsize
        self.rows = np.asarray(rows, dtype=np.int64)
        self._fd: int | None = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.rows)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fd": None, "_pid": -1}  # a worker opens the file itself

    def _file(self) -> int:
        if self._pid != os.getpid():
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        assert self._fd is not None
        return self._fd

    def _read(self, row: int) -> np.ndarray:
        data = os.pread(self._file(), self.row_bytes, self.header + int(row) * self.row_bytes)
        if len(data) != self.row_bytes:
            raise FeatureStoreError(f"{self.path}: row {row} is cut short (the file is truncated)")
        return np.frombuffer(data, dtype=DTYPE).reshape(self.row_shape)

    def __getitem__(self, index: int | slice | list[int]) -> torch.Tensor | StoreRows:
        """A row (N, D); a slice read at once (b, N, D); a list of positions: those rows, still on disk."""
        if isinstance(index, slice):
            return torch.stack([self[i] for i in range(*index.indices(len(self)))])  # (b, N, D)
        if isinstance(index, (list, np.ndarray)):
            return StoreRows(self.path, self.header, self.row_shape,
                             self.rows[np.asarray(index, dtype=np.int64)].tolist())
        return torch.from_numpy(self._read(self.rows[index]).copy())  # (N, D)

    def __del__(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)


def feature_batches(features: torch.Tensor | StoreRows, batch_size: int,
                    num_workers: int = 0) -> Iterator[torch.Tensor]:
    """Consecutive batches (B, N, D) of stored rows: read from disk by DataLoader workers, or sliced from a tensor."""
    if isinstance(features, torch.Tensor):
        for start in range(0, len(features), batch_size):
            yield features[start : start + batch_size]  # (B, N, D)
        return
    # Its own generator: the workers' seed must not come from the global RNG dropout uses.
    yield from DataLoader(features, batch_size=batch_size, num_workers=loader_workers(num_workers),
                          generator=torch.Generator())
