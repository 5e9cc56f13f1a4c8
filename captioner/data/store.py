"""The feature store: what an encoder's frozen blocks make, computed once, kept on disk in fp16.

A frozen encoder's store holds its grids; one that fine-tunes its top blocks stores the input
of the first block that trains (its cells on that block's grid), and training runs only the
blocks above it on the stored rows (`Encoder.from_stored`).

One split is two files in the store folder:

    <split>.npy    a numpy array (rows, N, D) of float16, row i = the grid of image i
    <split>.json   the manifest: encoder (name, settings, a fingerprint of its weights), image
                   size and transform, grid (h, w), feature dim, dtype, the image ids and paths in
                   row order, how many rows are written and which images failed to load

A store made by another encoder, image size or transform, or for another list of images, is
refused with one line naming the manifest and the field, never read silently. Extraction
writes in chunks and records its progress, so a crash, Ctrl-C or a full disk resumes where it
stopped. Each chunk's sha256 goes into the manifest as it is written; opening a finished store
checks the array against its manifest (shape, dtype, size) and every chunk against its sha256
in one streamed read, so a truncated or damaged array is refused by name before a row is used.

Reading: `StoreRows` answers `rows[i] -> (N, D)` with one positional read (`os.pread`) of the
row's bytes from a file it opens lazily in each process (each DataLoader worker has its own),
so the pages live in the kernel's page cache, shared by all workers, and never in the resident
memory of the reader: a memmap would map every page it touched into the process and its
resident size would grow towards the store's size over an epoch. Rows stay fp16 on their way
to the device (half the bytes to copy); the model casts them to its own dtype there.

The store runs an encoder and names it; it takes the encoder module and the transform that makes
its images (`StoreEncoder`, which captioner.models.encoders.Encoder is), not a whole model: the
data layer does not import the models. `split_features`, for training and evaluation, takes
anything that holds the two (a Captioner's `encoder` and `transform`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from captioner.core.config import Config, EncoderConfig
from captioner.core.errors import ConfigError, FeatureStoreError, StorageError
from captioner.core.files import size_text, write_atomically, write_failure
from captioner.core.progress import progress_bar
from captioner.core.process_settings import loader_workers
from captioner.data.batching import image_loader
from captioner.data.image_transform import IMAGENET, ImageTransform, PixelNormalization
from captioner.data.records import ImageRecord

log = logging.getLogger(__name__)

FORMAT = "captioner-feature-store"
VERSION = 1
DTYPE = np.float16
FP16_MAX = float(np.finfo(np.float16).max)
SAVE_PROGRESS_SECONDS = 10.0  # how much work a SIGKILL can lose at most (Ctrl-C and errors lose none)


def store_dir(config: Config) -> Path:
    """Where the store of `config` lives: `data.feature_store`, else `<train.out_dir>/features`."""
    return Path(config.data.feature_store or Path(config.train.out_dir) / "features")


def store_files(directory: str | Path, split: str) -> tuple[Path, Path]:
    directory = Path(directory)
    return directory / f"{split}.npy", directory / f"{split}.json"


class StoreEncoder(Protocol):
    """What the store needs of an encoder (captioner.models.encoders.Encoder is one): its frozen
    part maps uint8 images (B, 3, S, S) to cells (B, n, C) and their grid, normalising them
    itself; it says what built it, how it normalises, whether some of it is frozen (`storable`),
    the frozen part's weights and where it runs."""

    config: EncoderConfig
    normalize: PixelNormalization

    @property
    def frozen(self) -> bool: ...

    @property
    def storable(self) -> bool: ...

    @property
    def device(self) -> torch.device: ...

    def __call__(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]: ...

    def stored_part(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]: ...

    def frozen_state_dict(self) -> Mapping[str, torch.Tensor]: ...

    def eval(self) -> Any: ...

    def train(self, mode: bool = True) -> Any: ...

    @property
    def training(self) -> bool: ...


class EncodesImages(Protocol):
    """What holds an encoder and the transform of its images (a Captioner does)."""

    @property
    def encoder(self) -> StoreEncoder: ...

    @property
    def transform(self) -> ImageTransform: ...


def encoder_fingerprint(encoder: StoreEncoder) -> str:
    """A hash of the frozen part's state dict (names, shapes, dtypes, values, batch-norm
    statistics): what the stored rows depend on. Blocks that train change every step and are
    left out; for a frozen encoder it is the whole state dict."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in encoder.frozen_state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data if tensor.numel() else b"")
    return digest.hexdigest()


def input_pipeline(encoder: StoreEncoder, transform: ImageTransform) -> list[str]:
    """Every step from the decoded picture to the encoder's input, as the objects that run them
    state their settings: the transform's, then the encoder's normalisation."""
    return [*transform.describe(), *encoder.normalize.describe()]


def identity(encoder: StoreEncoder, transform: ImageTransform) -> dict[str, Any]:
    """What the features depend on, besides the images: the fields a store must match, in the
    order they are compared (the first mismatch names the error)."""
    config = encoder.config
    return {
        "encoder.name": config.name,
        "encoder.pretrained": config.pretrained,
        "encoder.grid_size": config.grid_size,
        "encoder.fine_tune_blocks": config.fine_tune_blocks,
        "encoder.fingerprint": encoder_fingerprint(encoder),
        "image_size": transform.image_size,
        "transform": input_pipeline(encoder, transform),  # the real pipeline's steps: a changed one marks the store stale
    }


def check_storable(encoder: StoreEncoder) -> None:
    if not encoder.storable:
        raise ConfigError(
            "model.encoder: a feature store needs some frozen blocks (pretrained: true, fine_tune_blocks >= 0 and fewer "
            f"than the backbone's blocks); every block of {encoder.config.name} here trains, so nothing it makes is fixed"
        )


# --- the store of one split -----------------------------------------------------------------------


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
        self.header_bytes = npy_header_bytes(self.array_path)

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
        """The rows as one fp16 tensor (len(rows), N, D) on `device`, read in chunks so the host
        never holds more than a chunk beside it."""
        out = torch.empty(len(rows), self.num_cells, self.feat_dim, dtype=torch.float16, device=device)  # (R, N, D)
        reader = self.rows(rows)
        chunk = max(1, (64 << 20) // self.row_bytes)  # 64 MB at a time
        for start in range(0, len(rows), chunk):
            stop = min(start + chunk, len(rows))
            out[start:stop] = torch.stack([reader[i] for i in range(start, stop)]).to(device)  # (chunk, N, D)
        return out

    def nbytes(self) -> int:
        return self.header_bytes + self.num_rows * self.row_bytes


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """A .npy file's shape, dtype and where its rows start, from its header alone."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
            return shape, dtype, f.tell()
    except (OSError, ValueError) as e:
        raise FeatureStoreError(f"{path}: not a readable feature array ({str(e)[:120]})") from None


def npy_header_bytes(path: Path) -> int:
    """Where the rows start in a .npy file (after its magic string and header)."""
    return npy_header(path)[2]


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise FeatureStoreError(f"{path}: not a readable feature store manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FeatureStoreError(f"{path}: not a captioner feature store manifest")
    if manifest.get("version") != VERSION:
        raise FeatureStoreError(f"{path}: store format version {manifest.get('version')} is not supported (this code reads {VERSION})")
    return manifest


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(manifest)))  # a crash or full disk never leaves half a manifest


def check_array(store: FeatureStore) -> None:
    """The array is what its manifest says (shape, dtype, every byte there) and, for a store
    that records them, every chunk has the sha256 recorded when it was written: one streamed
    read of the file. A store written before checksums is read with a warning."""
    manifest, array_path = store.manifest, store.array_path
    hint = f"run `captioner features CONFIG` again after deleting {array_path} and {store.manifest_path.name}"
    shape, dtype, _ = npy_header(array_path)
    if list(shape) != list(manifest["shape"]) or dtype != np.dtype(DTYPE):
        raise FeatureStoreError(
            f"{array_path}: holds {dtype} {tuple(shape)}, but {store.manifest_path.name} records {manifest['dtype']} "
            f"{tuple(manifest['shape'])}; {hint}"
        )
    expected_bytes = store.header_bytes + store.num_rows * store.row_bytes
    found_bytes = array_path.stat().st_size
    if found_bytes < expected_bytes:
        raise FeatureStoreError(f"{array_path}: {found_bytes} bytes, {expected_bytes} expected (truncated); {hint}")
    chunks = manifest.get("checksums")
    if chunks is None:
        log.warning("%s: written without checksums (by an earlier version): it cannot be checked for damage", array_path)
        return
    fd = os.open(array_path, os.O_RDONLY)
    try:
        def digest(chunk: list) -> str:
            first, count, _ = chunk
            return range_sha256(fd, store.header_bytes + first * store.row_bytes, count * store.row_bytes)

        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:  # sha256 releases the GIL
            for (first, count, recorded), found in zip(chunks, pool.map(digest, chunks)):
                if found != recorded:
                    raise FeatureStoreError(
                        f"{array_path}: rows {first}-{first + count - 1} differ from the sha256 recorded when they were written "
                        f"(the file is damaged or altered); {hint}"
                    )
    finally:
        os.close(fd)


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


# How stores written before the transform described its own steps named it: the square resize
# with antialiasing and ImageNet normalisation, which ran as torchvision's tensor resize (the
# steps below). Since the resize is Pillow's (data/image_transform._pipeline), those features differ by
# a level on a few pixels: such a store is stale, and is refused naming both pipelines.
LEGACY_TRANSFORM = {"resize": "square", "antialias": True, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def stored_identity(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's identity with an older store's transform named as the current code names its steps."""
    stored = dict(manifest["identity"])
    if stored.get("transform") == LEGACY_TRANSFORM and "image_size" in stored:
        size = stored["image_size"]
        tensor_resize = [repr(v2.PILToTensor()), repr(v2.Resize((size, size), antialias=True))]
        stored["transform"] = [*tensor_resize, *IMAGENET.describe()]
    return stored


def check_manifest(manifest_path: Path, manifest: dict[str, Any], expected: dict[str, Any], records: list[ImageRecord]) -> None:
    """Refuse, in one line naming the file and the field, a store made otherwise or for other images."""
    hint = f"delete {manifest_path.parent} or set data.feature_store to another folder"
    stored = stored_identity(manifest)
    for key, value in expected.items():
        if stored.get(key) != value:
            raise FeatureStoreError(f"{manifest_path}: {key} is {stored.get(key)!r} in the store but {value!r} here; {hint}")
    stored, wanted = manifest["image_ids"], [r.image_id for r in records]
    if stored != wanted:
        stored_set, wanted_set = set(stored), set(wanted)
        missing = [i for i in stored if i not in wanted_set]
        extra = [i for i in wanted if i not in stored_set]
        detail = (
            f"{len(missing)} of its images are no longer in the split (e.g. image {missing[0]}, "
            f"{manifest['paths'][stored.index(missing[0])]})" if missing
            else f"the split has {len(extra)} images it lacks (e.g. image {extra[0]})" if extra
            else "the images are in another order"
        )
        raise FeatureStoreError(f"{manifest_path}: image_ids differ from the {manifest['split']} split: {detail}; {hint}")


def open_store(
    directory: str | Path, split: str, encoder: StoreEncoder, transform: ImageTransform, records: list[ImageRecord],
) -> FeatureStore:
    """The complete store of `split`, checked against the encoder, its transform and the split's `records`."""
    array_path, manifest_path = store_files(directory, split)
    if not manifest_path.is_file() or not array_path.is_file():
        raise FeatureStoreError(f"{manifest_path}: no feature store for {split} here (make it with `captioner features CONFIG`)")
    manifest = read_manifest(manifest_path)
    check_manifest(manifest_path, manifest, identity(encoder, transform), records)
    store = FeatureStore(directory, split, manifest)
    if not store.complete:
        raise FeatureStoreError(
            f"{manifest_path}: extraction stopped at row {manifest['rows_done']} of {store.num_rows}; "
            "run `captioner features CONFIG` again to finish it"
        )
    check_array(store)
    return store


def ensure_store(
    encoder: StoreEncoder, transform: ImageTransform, directory: str | Path, split: str, records: list[ImageRecord],
    batch_size: int, num_workers: int = 0, progress: bool = True,
) -> FeatureStore:
    """Open the store of `split`, extracting (or finishing) it first when needed."""
    _, manifest_path = store_files(directory, split)
    if manifest_path.is_file():
        manifest = read_manifest(manifest_path)
        check_manifest(manifest_path, manifest, identity(encoder, transform), records)
        if manifest["rows_done"] == len(manifest["image_ids"]):
            store = FeatureStore(directory, split, manifest)
            check_array(store)
            return store
    return extract(encoder, transform, directory, split, records, batch_size, num_workers, progress)


# --- extraction -----------------------------------------------------------------------------------


@torch.no_grad()
def probe_grid(encoder: StoreEncoder, image_size: int) -> tuple[tuple[int, int], int]:
    """The grid (h, w) and width of the cells the encoder's frozen part gives at `image_size`."""
    encoder.eval()
    cells, grid = encoder.stored_part(torch.zeros(1, 3, image_size, image_size, device=encoder.device))  # (1, n, C)
    return grid, cells.shape[-1]


@torch.no_grad()
def output_grid(encoder: StoreEncoder, image_size: int) -> tuple[int, int]:
    """The grid (h, w) of the whole encoder's output at `image_size` (its attention maps'),
    probed in eval mode, so that no batch-norm statistic moves; the mode is restored."""
    training = encoder.training
    encoder.eval()
    _, grid = encoder(torch.zeros(1, 3, image_size, image_size, device=encoder.device))  # (1, N, D)
    encoder.train(training)
    return grid


@torch.no_grad()
def extract(
    encoder: StoreEncoder, transform: ImageTransform, directory: str | Path, split: str, records: list[ImageRecord],
    batch_size: int, num_workers: int = 0, progress: bool = True,
) -> FeatureStore:
    """Encode every image of `records` once into the store of `split`; resumes a stopped run.

    Prints the size before it starts and stops with one line when the disk lacks the space.
    Images that fail to load are recorded in the manifest and their rows left as zeros.
    """
    check_storable(encoder)
    if not records:
        raise FeatureStoreError(f"{split}: no images to encode")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    array_path, manifest_path = store_files(directory, split)
    expected = identity(encoder, transform)
    grid, feat_dim = probe_grid(encoder, transform.image_size)
    shape = (len(records), grid[0] * grid[1], feat_dim)
    fresh = not (manifest_path.is_file() and array_path.is_file())
    if not fresh:
        manifest = read_manifest(manifest_path)
        check_manifest(manifest_path, manifest, expected, records)
    else:
        manifest = {
            "format": FORMAT, "version": VERSION, "split": split, "identity": expected,
            "grid": list(grid), "feat_dim": feat_dim, "dtype": np.dtype(DTYPE).name, "shape": list(shape),
            "image_ids": [r.image_id for r in records], "paths": [str(r.path) for r in records],
            "rows_done": 0, "failed": [], "seconds": 0.0, "checksums": [],  # [first row, rows, sha256] per chunk written
        }
    total = int(np.prod(shape)) * np.dtype(DTYPE).itemsize
    start = manifest["rows_done"]
    allocated = array_path.stat().st_blocks * 512 if not fresh else 0
    needed = max(0, total - allocated)
    free = shutil.disk_usage(directory).free
    verb = f"resuming at row {start} of {len(records)}" if start else f"{len(records)} images"
    log.info("%s: %s -> %d x %dx%d x %d fp16 = %s in %s", split, verb, shape[0], *grid, feat_dim, size_text(total), array_path)
    if needed > free:
        raise FeatureStoreError(
            f"{directory}: the {split} store needs {size_text(needed)} more on disk, only {size_text(free)} is free"
            + ("" if encoder.frozen else " (or train the fine-tuned encoder on the images: train.cache_features=false)")
        )
    if fresh:  # (an array left without its manifest is overwritten: nothing says what it holds)
        try:
            np.lib.format.open_memmap(array_path, mode="w+", dtype=DTYPE, shape=shape)  # header + a sparse file, no data written
        except OSError as e:
            raise write_failure(array_path, e) from None
        write_manifest(manifest_path, manifest)
    checksums = manifest.get("checksums")  # None: a store begun by an earlier version, which recorded none
    header = npy_header_bytes(array_path)
    row_bytes = shape[1] * shape[2] * np.dtype(DTYPE).itemsize
    if array_path.stat().st_size < header + total:  # cut at its last row done by a full disk: sparse again to its size
        os.truncate(array_path, header + total)

    encoder.eval()
    began, saved = time.time(), time.time()
    seconds_before = manifest["seconds"]
    fd = os.open(array_path, os.O_WRONLY)
    bar = progress_bar(total=len(records), initial=start, desc=f"features {split}", unit="img", enabled=progress, dynamic_ncols=True)
    try:
        # The loader yields one batch (or None when none of its images loaded) per batch_size records.
        # Its seed draw is taken in a fork of the global RNG, so that training goes the same way
        # whether the store was built in this process or before.
        with torch.random.fork_rng(devices=[]):
            batches = iter(image_loader(records[start:], transform, batch_size, num_workers))
        for first in range(start, len(records), batch_size):
            count = min(batch_size, len(records) - first)
            batch = next(batches)
            block = np.zeros((count, *shape[1:]), dtype=DTYPE)  # (b, N, D); rows of failed images stay zero
            loaded = set()
            if batch is not None:
                images, indices = batch
                feats, _ = encoder.stored_part(images.to(encoder.device))  # (B, n, C)
                feats = feats.float().clamp_(-FP16_MAX, FP16_MAX).to(torch.float16).cpu().numpy()
                local = indices.numpy() - (first - start)  # loader indices count from `start`
                block[local] = feats
                loaded = set(local.tolist())
            data = block.tobytes()
            try:
                written = os.pwrite(fd, data, header + first * row_bytes)
                if written != len(data):  # a short write: the disk filled during it
                    raise OSError(28, os.strerror(28))
            except OSError as e:
                # The rows from `first` on are not done: cutting the file there gives back the pages a
                # partial write took, so that the manifest saying how far it got still fits on the disk.
                os.ftruncate(fd, header + first * row_bytes)
                raise write_failure(array_path, e, "; the rows written so far are kept: run again when there is space and it resumes") from None
            if checksums is not None:
                checksums.append([first, count, hashlib.sha256(data).hexdigest()])
            for i in range(count):
                if i not in loaded:
                    record = records[first + i]
                    manifest["failed"].append({"row": first + i, "image_id": record.image_id, "path": str(record.path)})
                    log.warning("%s: image %d (%s) failed to load; recorded and skipped", split, record.image_id, record.path)
            manifest["rows_done"] = first + count
            bar.update(count)
            if time.time() - saved > SAVE_PROGRESS_SECONDS:
                manifest["seconds"] = round(seconds_before + time.time() - began, 1)
                write_manifest(manifest_path, manifest)
                saved = time.time()
    finally:
        bar.close()
        os.close(fd)
        manifest["seconds"] = round(seconds_before + time.time() - began, 1)
        try:
            write_manifest(manifest_path, manifest)  # the rows written so far count, whatever stopped us
        except StorageError as e:  # a full disk: the manifest saved last stands, and a resume redoes the rows since
            log.warning("%s", e)
    if len(manifest["failed"]) == len(records):
        raise FeatureStoreError(f"{manifest_path}: none of the {len(records)} {split} images could be loaded")
    return FeatureStore(directory, split, manifest)


# --- reading --------------------------------------------------------------------------------------


class StoreRows:
    """Rows of a store, read on demand: `rows[i] -> (N, D)` fp16, `rows[a:b] -> (b - a, N, D)`.

    The file is opened on first use in each process, so a DataLoader worker opens its own.
    """

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
        """A row (N, D); a slice of rows read at once (b, N, D); a list of positions: those
        rows, still on disk (as `tensor[list]` selects rows of a tensor)."""
        if isinstance(index, slice):
            return torch.stack([self[i] for i in range(*index.indices(len(self)))])  # (b, N, D)
        if isinstance(index, (list, np.ndarray)):
            return StoreRows(self.path, self.header, self.row_shape, self.rows[np.asarray(index, dtype=np.int64)].tolist())
        return torch.from_numpy(self._read(self.rows[index]).copy())  # (N, D)

    def __del__(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)


class _RowDataset(Dataset):
    def __init__(self, features: StoreRows) -> None:
        self.features = features

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.features[i]


def feature_batches(features: torch.Tensor | StoreRows, batch_size: int, num_workers: int = 0) -> Iterator[torch.Tensor]:
    """Consecutive batches (B, N, D) of stored rows: read by DataLoader workers from disk, or
    sliced from a tensor already in memory or on the device."""
    if isinstance(features, torch.Tensor):
        for start in range(0, len(features), batch_size):
            yield features[start : start + batch_size]  # (B, N, D)
        return
    # Its own generator: a loader seeds its workers with a draw, which must not come from the
    # global RNG that dropout uses (validating would change the training that follows).
    yield from DataLoader(_RowDataset(features), batch_size=batch_size, num_workers=loader_workers(num_workers), generator=torch.Generator())


@dataclass
class SplitFeatures:
    """What training or evaluation needs of a split's store: the records kept, their rows
    (read from disk, or a tensor in memory or on the device), the grid of the encoder's output
    (of the stored rows themselves when it is frozen)."""

    records: list[ImageRecord]
    features: torch.Tensor | StoreRows
    grid: tuple[int, int]


def split_features(
    model: EncodesImages, config: Config, split: str, records: list[ImageRecord],
    use: list[ImageRecord] | None = None, build: bool = True,
) -> SplitFeatures:
    """The stored features of `use` (default: all of `records`, the whole split), the store
    of `model.encoder` with `model.transform` (a Captioner's) built first when absent (`build`),
    refused when stale. With `data.features_on_device` the rows are loaded onto the encoder's
    device when they fit (on a CPU: into memory)."""
    directory = store_dir(config)
    data = config.data
    encoder, transform = model.encoder, model.transform
    device = encoder.device
    if build:
        store = ensure_store(encoder, transform, directory, split, records, data.batch_size, data.num_workers)
    else:
        store = open_store(directory, split, encoder, transform, records)
    kept, rows = store.rows_of(records if use is None else use)
    grid = store.grid if encoder.frozen else output_grid(encoder, transform.image_size)  # cells of the trunk: the top blocks pool them
    if store.failed_rows:
        log.warning("%s: %d images failed to load at extraction and are skipped (%s)", split, len(store.failed_rows), store.manifest_path)
    if data.features_on_device:
        need = len(rows) * store.row_bytes
        free = free_memory(device)
        if need < 0.9 * free:
            log.info("%s: %s of features loaded onto %s", split, size_text(need), device)
            return SplitFeatures(kept, store.load(rows, device), grid)
        log.warning(
            "%s: data.features_on_device is set but %s of features do not fit in the %s free on %s; reading from disk",
            split, size_text(need), size_text(free), device,
        )
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
