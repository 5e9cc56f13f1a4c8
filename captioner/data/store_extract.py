"""Extracting a feature store: every image of a split encoded once into `<split>.npy`, resumably. Chunks' progress
and sha256 go into the manifest, so a crash, Ctrl-C or a full disk resumes there. `split_features`: a split's
stored features for training and evaluation, built when absent, on disk or on the device."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captioner.core.config_sections import Config
from captioner.core.errors import FeatureStoreError, StorageError
from captioner.core.files import make_folder, size_text, write_failure
from captioner.core.machine_cache import folder_held
from captioner.core.progress import progress_bar
from captioner.data.batching import image_loader
from captioner.data.image_transform import ImageTransform
from captioner.data.records import ImageRecord
from captioner.data.store_format import (DTYPE, FORMAT, VERSION, EncodesImages, FeatureStore, StoreEncoder, StoreRows,
                                          check_array, check_storable, existing_store, identity, npy_header, open_store,
                                          store_dir, store_files, write_manifest)

log = logging.getLogger(__name__)

FP16_MAX = float(np.finfo(np.float16).max)
SAVE_PROGRESS_SECONDS = 10.0  # how much work a SIGKILL can lose at most (Ctrl-C and errors lose none)


@dataclass
class Extraction:
    """One split's extraction: where it writes, the array's shape and the manifest it keeps."""

    split: str
    array_path: Path
    manifest_path: Path
    manifest: dict[str, Any]
    fresh: bool  # no array and manifest yet: both are made anew

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.manifest["shape"])  # type: ignore[return-value]

    @property
    def row_bytes(self) -> int:
        return self.shape[1] * self.shape[2] * np.dtype(DTYPE).itemsize

    @property
    def total_bytes(self) -> int:
        return self.shape[0] * self.row_bytes


@torch.no_grad()
def extract(encoder: StoreEncoder, transform: ImageTransform, directory: str | Path, split: str,
            records: list[ImageRecord], batch_size: int, num_workers: int = 0, progress: bool = True) -> FeatureStore:
    """Encode every image of `records` once into the store of `split`, resuming; failed images' rows stay zero."""
    check_storable(encoder)
    if not records:
        raise FeatureStoreError(f"{split}: no images to encode")
    directory = make_store_folder(directory)
    job = plan_extraction(encoder, transform, directory, split, records)
    check_disk_space(job, directory, encoder.frozen)
    header = allocate_array(job)
    encoder.eval()
    encode_batches(encoder, transform, records, job, header, batch_size, num_workers, progress)
    if len(job.manifest["failed"]) == len(records):
        raise FeatureStoreError(f"{job.manifest_path}: none of the {len(records)} {split} images could be loaded")
    return FeatureStore(directory, split, job.manifest)


def make_store_folder(directory: str | Path) -> Path:
    """The store's folder, made before any image is encoded; one line when a file stands there (or where one of
    its parents goes) or it cannot be made, never an OSError's traceback."""
    return make_folder(directory, str(directory), FeatureStoreError, "for the feature store")


def plan_extraction(encoder: StoreEncoder, transform: ImageTransform, directory: Path, split: str,
                    records: list[ImageRecord]) -> Extraction:
    """The manifest to extract under: the one on disk (checked) when its array is there too, else a new one."""
    grid, feat_dim = probe_grid(encoder, transform.image_size)
    store = existing_store(directory, split, encoder, transform, records)
    fresh = store is None
    manifest = new_manifest(split, identity(encoder, transform), grid, feat_dim, records) if fresh else store.manifest
    return Extraction(split, *store_files(directory, split), manifest, fresh=fresh)


def new_manifest(split: str, expected: dict[str, Any], grid: tuple[int, int], feat_dim: int,
                 records: list[ImageRecord]) -> dict[str, Any]:
    """The manifest of a store not begun: no row done, no image failed, no chunk written."""
    shape = (len(records), grid[0] * grid[1], feat_dim)  # (rows, N, D)
    return {
        "format": FORMAT, "version": VERSION, "split": split, "identity": expected,
        "grid": list(grid), "feat_dim": feat_dim, "dtype": np.dtype(DTYPE).name, "shape": list(shape),
        "image_ids": [r.image_id for r in records], "paths": [str(r.path) for r in records],
        "rows_done": 0, "failed": [], "seconds": 0.0, "checksums": [],  # [first row, rows, sha256] per chunk
    }


def check_disk_space(job: Extraction, directory: Path, frozen: bool) -> None:
    """Log what will be written; refuse when the disk lacks the space (a resumed array's blocks count as had)."""
    shape, total, start = job.shape, job.total_bytes, job.manifest["rows_done"]
    allocated = job.array_path.stat().st_blocks * 512 if not job.fresh else 0
    needed = max(0, total - allocated)
    free = shutil.disk_usage(directory).free
    verb = f"resuming at row {start} of {shape[0]}" if start else f"{shape[0]} images"
    log.info("%s: %s -> %d x %dx%d x %d fp16 = %s in %s", job.split, verb, shape[0], *job.manifest["grid"], shape[2],
             size_text(total), job.array_path)
    if needed > free:
        raise FeatureStoreError(
            f"{directory}: the {job.split} store needs {size_text(needed)} more on disk, only {size_text(free)} is free"
            + ("" if frozen else " (or train the fine-tuned encoder on the images: train.cache_features=false)"))


def allocate_array(job: Extraction) -> int:
    """Make a fresh store's sparse array and manifest, or regrow a resumed one; where its rows start."""
    if job.fresh:  # (an array left without its manifest is overwritten: nothing says what it holds)
        try:
            np.lib.format.open_memmap(job.array_path, mode="w+", dtype=DTYPE, shape=job.shape)
        except OSError as e:
            raise write_failure(job.array_path, e) from None
        write_manifest(job.manifest_path, job.manifest)
    header = npy_header(job.array_path)[2]
    # Cut at its last row done by a full disk: sparse again to its size.
    if job.array_path.stat().st_size < header + job.total_bytes:
        os.truncate(job.array_path, header + job.total_bytes)
    return header


def encode_batches(encoder: StoreEncoder, transform: ImageTransform, records: list[ImageRecord], job: Extraction,
                   header: int, batch_size: int, num_workers: int, progress: bool) -> None:
    """Encode, write and record the rows from `rows_done` on; the manifest saved now and then and at the end."""
    manifest, start = job.manifest, job.manifest["rows_done"]
    checksums = manifest.get("checksums")  # None: a store begun by a version that recorded none
    began, saved = time.time(), time.time()
    seconds_before = manifest["seconds"]
    fd = os.open(job.array_path, os.O_WRONLY)
    bar = progress_bar(total=len(records), initial=start, desc=f"features {job.split}", unit="img", enabled=progress,
                       dynamic_ncols=True)
    try:
        # One batch (or None) per batch_size records, seeded in a fork: training's RNG is the same, new store or not.
        with torch.random.fork_rng(devices=[]):
            batches = iter(image_loader(records[start:], transform, batch_size, num_workers))
        for first in range(start, len(records), batch_size):
            count = min(batch_size, len(records) - first)
            block, loaded = encode_block(encoder, next(batches), count, first - start, job.shape[1:])
            data = block.tobytes()
            write_rows(fd, data, header + first * job.row_bytes, job.array_path)
            if checksums is not None:
                checksums.append([first, count, hashlib.sha256(data).hexdigest()])
            record_failures(manifest, records, first, count, loaded, job.split)
            manifest["rows_done"] = first + count
            bar.update(count)
            if time.time() - saved > SAVE_PROGRESS_SECONDS:
                manifest["seconds"] = round(seconds_before + time.time() - began, 1)
                write_manifest(job.manifest_path, manifest)
                saved = time.time()
    finally:
        bar.close()
        os.close(fd)
        manifest["seconds"] = round(seconds_before + time.time() - began, 1)
        try:
            write_manifest(job.manifest_path, manifest)  # the rows written so far count, whatever stopped us
        except StorageError as e:  # a full disk: the last manifest stands; a resume redoes the rows since
            log.warning("%s", e)


def encode_block(encoder: StoreEncoder, batch: tuple[torch.Tensor, torch.Tensor] | None, count: int, offset: int,
                 row_shape: tuple[int, ...]) -> tuple[np.ndarray, set[int]]:
    """The `count` fp16 rows of one batch (zeros where an image failed) and the positions that loaded."""
    block = np.zeros((count, *row_shape), dtype=DTYPE)  # (b, N, D); rows of failed images stay zero
    if batch is None:
        return block, set()
    images, indices = batch
    feats, _ = encoder.stored_part(images.to(encoder.device))  # (B, n, C)
    feats = feats.float().clamp_(-FP16_MAX, FP16_MAX).to(torch.float16).cpu().numpy()  # (B, n, C): no inf
    local = indices.numpy() - offset  # (B,): loader indices count from the first row of this run
    block[local] = feats
    return block, set(local.tolist())


def write_rows(fd: int, data: bytes, offset: int, array_path: Path) -> None:
    """Write one chunk of rows at `offset`; on a full disk cut the file there and say so in one line."""
    try:
        written = os.pwrite(fd, data, offset)
        if written != len(data):  # a short write: the disk filled during it
            raise OSError(28, os.strerror(28))
    except OSError as e:
        # Cut the file at the rows not done: the pages a partial write took are freed for the manifest.
        os.ftruncate(fd, offset)
        raise write_failure(array_path, e, "; the rows written so far are kept: "
                                           "run again when there is space and it resumes") from None


def record_failures(manifest: dict[str, Any], records: list[ImageRecord], first: int, count: int, loaded: set[int],
                    split: str) -> None:
    """Record in the manifest, and warn about, each image of rows first..first+count-1 that did not load."""
    for i in range(count):
        if i not in loaded:
            record = records[first + i]
            manifest["failed"].append({"row": first + i, "image_id": record.image_id, "path": str(record.path)})
            log.warning("%s: image %d (%s) failed to load; recorded and skipped", split, record.image_id, record.path)


@torch.no_grad()
def probe_grid(encoder: StoreEncoder, image_size: int, stored: bool = True) -> tuple[tuple[int, int], int]:
    """The grid (h, w) and width of the cells the encoder's frozen part (not `stored`: the whole encoder) gives at
    `image_size`, probed in eval mode (no batch-norm update)."""
    training = encoder.training
    encoder.eval()
    probe = encoder.stored_part if stored else encoder
    cells, grid = probe(torch.zeros(1, 3, image_size, image_size, device=encoder.device))  # (1, n, C)
    encoder.train(training)
    return grid, cells.shape[-1]


def ensure_store(encoder: StoreEncoder, transform: ImageTransform, directory: str | Path, split: str,
                 records: list[ImageRecord], batch_size: int, num_workers: int = 0,
                 progress: bool = True) -> FeatureStore:
    """Open the store of `split`, extracting (or finishing) it first when needed. The split's store is held while it
    is extracted (`core.machine_cache.folder_held`): a second run sharing the store waits, saying so, then opens it
    finished, instead of resuming it beside the first, both writing its rows and its manifest."""
    store = existing_store(directory, split, encoder, transform, records)
    if store is not None and store.complete:
        return check_array(store)
    folder = make_store_folder(directory)
    with folder_held(f"features-{split}", folder, f"extracting the {split} feature store into {folder}", log):
        store = existing_store(folder, split, encoder, transform, records)  # finished while this one waited
        if store is None or not store.complete:
            return extract(encoder, transform, folder, split, records, batch_size, num_workers, progress)
    return check_array(store)


def output_grid(encoder: StoreEncoder, image_size: int) -> tuple[int, int]:
    """The grid (h, w) of the encoder's output at `image_size`."""
    return probe_grid(encoder, image_size, stored=False)[0]


@dataclass
class SplitFeatures:
    """A split's stored features: the records kept, their rows (on disk or a tensor), the encoder's grid."""

    records: list[ImageRecord]
    features: torch.Tensor | StoreRows
    grid: tuple[int, int]


def split_features(model: EncodesImages, config: Config, split: str, records: list[ImageRecord],
                   use: list[ImageRecord] | None = None, build: bool = True) -> SplitFeatures:
    """The stored features of `use` (default: `records`), built if absent (`build`); on the device if they fit."""
    data, encoder, transform = config.data, model.encoder, model.transform
    device = encoder.device
    store = (ensure_store(encoder, transform, store_dir(config), split, records, data.batch_size, data.num_workers)
             if build else open_store(store_dir(config), split, encoder, transform, records))
    kept, rows = store.rows_of(records if use is None else use)
    # Fine-tuned top blocks pool the trunk's cells: their own grid.
    grid = store.grid if encoder.frozen else output_grid(encoder, transform.image_size)
    if store.failed_rows:
        log.warning("%s: %d images failed to load at extraction and are skipped (%s)", split, len(store.failed_rows),
                    store.manifest_path)
    if data.features_on_device:
        need = len(rows) * store.row_bytes
        free = free_memory(device)
        if need < 0.9 * free:
            log.info("%s: %s of features loaded onto %s", split, size_text(need), device)
            return SplitFeatures(kept, store.load(rows, device), grid)
        log.warning("%s: data.features_on_device is set but %s of features do not fit in the %s free on %s; "
                    "reading from disk", split, size_text(need), size_text(free), device)
    return SplitFeatures(kept, store.rows(rows), grid)


def free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
