"""The feature store: what an encoder's frozen blocks make, kept on disk in fp16. A `<split>.json` manifest names
the encoder, transform and images, so a store made otherwise is refused in one line. A finished store is read
here: `open_store` checks it whole, `StoreRows` reads its rows. A row is one `os.pread`, so pages stay in the
shared page cache, not in each worker's memory as a memmap's would."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader

from captioner.core.bounded_files import check_regular_file, read_json
from captioner.core.config_sections import Config, EncoderConfig
from captioner.core.errors import ConfigError, FeatureStoreError
from captioner.core.files import write_atomically
from captioner.core.process_settings import loader_workers
from captioner.data.image_transform import IMAGENET, ImageTransform, PixelNormalization
from captioner.data.records import ImageRecord

log = logging.getLogger(__name__)

FORMAT = "captioner-feature-store"
VERSION = 1
DTYPE = np.float16


def store_dir(config: Config) -> Path:
    """Where the store of `config` lives: `data.feature_store`, else `<train.out_dir>/features`."""
    return Path(config.data.feature_store or Path(config.train.out_dir) / "features")


def store_files(directory: str | Path, split: str) -> tuple[Path, Path]:
    return Path(directory, f"{split}.npy"), Path(directory, f"{split}.json")


class StoreEncoder(Protocol):
    """What the store needs of an encoder: a frozen part mapping uint8 (B, 3, S, S) to cells (B, n, C), its grid."""

    config: EncoderConfig
    normalize: PixelNormalization
    training: bool  # nn.Module's mode flag

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


class EncodesImages(Protocol):
    """What holds an encoder and the transform of its images (a Captioner does)."""

    @property
    def encoder(self) -> StoreEncoder: ...

    @property
    def transform(self) -> ImageTransform: ...


def encoder_fingerprint(encoder: StoreEncoder) -> str:
    """A hash of the frozen part's state dict (names, shapes, dtypes, values): what the stored rows depend on."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in encoder.frozen_state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data if tensor.numel() else b"")
    return digest.hexdigest()


def identity(encoder: StoreEncoder, transform: ImageTransform) -> dict[str, Any]:
    """What the features depend on besides the images, in the order a store's fields are compared."""
    config = encoder.config
    return {
        "encoder.name": config.name,
        "encoder.pretrained": config.pretrained,
        "encoder.grid_size": config.grid_size,
        "encoder.fine_tune_blocks": config.fine_tune_blocks,
        "encoder.fingerprint": encoder_fingerprint(encoder),
        "image_size": transform.image_size,
        # every step from the decoded picture to the encoder's input: a changed one makes the store stale
        "transform": [*transform.describe(), *encoder.normalize.describe()],
    }


def check_storable(encoder: StoreEncoder) -> None:
    if not encoder.storable:
        raise ConfigError("model.encoder: a feature store needs some frozen blocks (pretrained: true, "
                          f"fine_tune_blocks >= 0 and fewer than the backbone's blocks); every block of "
                          f"{encoder.config.name} here trains, so nothing it makes is fixed")


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """A .npy file's shape, dtype and where its rows start, from its header alone."""
    try:
        check_regular_file(path, "feature array", FeatureStoreError)  # opening a pipe would wait for a writer
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
            return shape, dtype, f.tell()
    except (OSError, ValueError) as e:
        raise FeatureStoreError(f"{path}: not a readable feature array ({str(e)[:120]})") from None


def read_manifest(path: Path) -> dict[str, Any]:
    """A split's manifest (the user's own store: no size cap), every way it cannot be read one FeatureStoreError."""
    try:  # a pipe, bytes that are not UTF-8 or JSON nested past the depth limit: one line naming it
        manifest = read_json(path, "feature store manifest", FeatureStoreError, max_bytes=sys.maxsize)
    except FileNotFoundError:
        raise FeatureStoreError(f"{path}: no feature store manifest") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FeatureStoreError(f"{path}: not a captioner feature store manifest")
    if manifest.get("version") != VERSION:
        raise FeatureStoreError(f"{path}: store format version {manifest.get('version')} is not supported "
                                f"(this code reads {VERSION})")
    return manifest


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(manifest)))  # never half a manifest


# An older store's transform: torchvision's tensor resize, a level off Pillow's on some pixels (refused).
LEGACY_TRANSFORM = {"resize": "square", "antialias": True, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def stored_identity(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's identity with an older store's transform named as the current code names its steps."""
    stored = dict(manifest["identity"])
    if stored.get("transform") == LEGACY_TRANSFORM and "image_size" in stored:
        from torchvision.transforms import v2  # only for such a store: a caption or evaluation never loads it

        size = stored["image_size"]
        tensor_resize = [repr(v2.PILToTensor()), repr(v2.Resize((size, size), antialias=True))]
        stored["transform"] = [*tensor_resize, *IMAGENET.describe()]
    return stored


def check_manifest(manifest_path: Path, manifest: dict[str, Any], expected: dict[str, Any],
                   records: list[ImageRecord]) -> None:
    """Refuse, in one line naming the file and the field, a store made otherwise or for other images."""
    hint = f"delete {manifest_path.parent} or set data.feature_store to another folder"
    stored = stored_identity(manifest)
    for key, value in expected.items():
        if stored.get(key) != value:
            raise FeatureStoreError(f"{manifest_path}: {key} is {stored.get(key)!r} in the store but {value!r} here; "
                                    f"{hint}")
    stored, wanted = manifest["image_ids"], [r.image_id for r in records]
    if stored != wanted:
        stored_set, wanted_set = set(stored), set(wanted)
        missing = [i for i in stored if i not in wanted_set]
        extra = [i for i in wanted if i not in stored_set]
        detail = (f"{len(missing)} of its images are no longer in the split (e.g. image {missing[0]}, "
                  f"{manifest['paths'][stored.index(missing[0])]})" if missing
                  else f"the split has {len(extra)} images it lacks (e.g. image {extra[0]})" if extra
                  else "the images are in another order")
        raise FeatureStoreError(f"{manifest_path}: image_ids differ from the {manifest['split']} split: "
                                f"{detail}; {hint}")


class FeatureStore:
    """One split's store on disk, its manifest checked against an encoder and a list of images."""

    def __init__(self, directory: str | Path, split: str, manifest: dict[str, Any]) -> None:
        self.array_path, self.manifest_path = store_files(directory, split)
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
    spans = [(store.header_bytes + first * store.row_bytes, count * store.row_bytes) for first, count, _ in chunks]
    fd = os.open(array_path, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:  # sha256 releases the GIL
            for (first, count, recorded), found in zip(chunks, pool.map(lambda span: range_sha256(fd, *span), spans)):
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
    while offset < end and (block := os.pread(fd, min(end - offset, 1 << 20), offset)):  # cut short: digest differs
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

    def __getitem__(self, index: int | slice | list[int]) -> torch.Tensor | StoreRows:
        """A row (N, D); a slice read at once (b, N, D); a list of positions: those rows, still on disk."""
        if isinstance(index, slice):
            return torch.stack([self[i] for i in range(*index.indices(len(self)))])  # (b, N, D)
        if isinstance(index, (list, np.ndarray)):
            return StoreRows(self.path, self.header, self.row_shape,
                             self.rows[np.asarray(index, dtype=np.int64)].tolist())
        if self._pid != os.getpid():
            self._fd, self._pid = os.open(self.path, os.O_RDONLY), os.getpid()
        assert self._fd is not None
        row = int(self.rows[index])
        data = os.pread(self._fd, self.row_bytes, self.header + row * self.row_bytes)
        if len(data) != self.row_bytes:
            raise FeatureStoreError(f"{self.path}: row {row} is cut short (the file is truncated)")
        return torch.from_numpy(np.frombuffer(data, dtype=DTYPE).reshape(self.row_shape).copy())  # (N, D)

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
