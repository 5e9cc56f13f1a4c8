"""A Hugging Face dataset on disk (a `save_to_disk` folder or Parquet files), read with no network. An image
path out of the dataset's folder (or `data.image_root`), links included, is refused unread."""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from captioner.core.bounded_files import Confinement, is_within
from captioner.core.errors import DatasetError, ImageLoadError
from captioner.data.imagefolder import SPLIT_FOLDERS, caption_texts, seeded_split
from captioner.data.records import ImageRecord

log = logging.getLogger(__name__)

SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what save_to_disk writes (a DatasetDict, a Dataset)


@functools.lru_cache(maxsize=8)
def open_dataset(root: str) -> dict[str, Any]:
    """Split name (as the dataset names it) -> `datasets.Dataset`, opened once per process."""
    path = Path(root)
    if not path.exists():
        raise DatasetError(f"{root}: Hugging Face dataset not found")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only: never wait on the Hub
    import datasets  # the 'data' extra; the CLI names it when missing (core/errors.py)

    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    try:
        if path.is_dir() and any((path / m).is_file() for m in SAVED_MARKERS):
            loaded = datasets.load_from_disk(str(path))
        elif path.is_file() and path.suffix == ".parquet":
            loaded = datasets.load_dataset("parquet", data_files={"train": str(path)})
        elif path.is_dir() and next(path.rglob("*.parquet"), None) is not None:
            loaded = datasets.load_dataset("parquet", data_dir=str(path))
        else:
            raise DatasetError(f"{root}: not a Hugging Face dataset on disk "
                               f"(no {' or '.join(SAVED_MARKERS)} from save_to_disk, no .parquet files)")
    except DatasetError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many kinds for a damaged folder; one line names it
        raise DatasetError(f"{root}: cannot read the Hugging Face dataset "
                           f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}


def _split_key(splits: dict[str, Any], split: str) -> str | None:
    return next((name for name in SPLIT_FOLDERS[split] if name in splits), None)


@dataclass(frozen=True)
class DatasetImages:
    """The image column of one split of a dataset on disk, read by row."""

    root: str
    split: str  # the dataset's own split name
    column: str
    image_root: str | None = None  # the folder its image paths are inside (data.image_root); None: the dataset's

    def read(self, row: int) -> bytes:
        value = _image_column(self.root, self.split, self.column)[row].as_py()
        name = f"{self.root} ({self.split}, row {row}, column {self.column!r})"
        if isinstance(value, dict):  # an Image feature: {"bytes": ..., "path": ...}
            value = value.get("bytes") or value.get("path")
        if isinstance(value, (bytes, bytearray)):
            return bytes(value)
        if isinstance(value, str) and value:
            file = image_file(value, self.image_root or dataset_folder(self.root), name)
            try:
                return file.read_bytes()
            except OSError as e:
                raise ImageLoadError(f"{name}: cannot read {file} ({e.strerror or e})") from None
        raise ImageLoadError(f"{name}: no image (the cell is {type(value).__name__})")


def dataset_folder(root: str) -> str:
    """The folder a dataset's relative image paths start from: `root`, or a .parquet file's folder."""
    return str(Path(root).parent) if Path(root).is_file() else root


def image_file(value: str, folder: str, name: str) -> Path:
    """The file an image path names inside `folder` (links resolved), or an ImageLoadError naming the row."""
    parts = PurePosixPath(value.replace("\\", "/"))
    if parts.is_absolute() or os.path.isabs(value):
        inside = os.path.normpath(value)
        if not is_within(inside, os.path.normpath(os.path.abspath(folder))):
            raise ImageLoadError(f"{name}: the image path {value!r} is outside the dataset's folder {folder}; refused "
                                 "(set data.image_root to the folder that holds its images)")
        file = Path(inside)
    elif ".." in parts.parts:
        raise ImageLoadError(f"{name}: the image path {value!r} leaves the dataset's folder {folder} (..); refused")
    else:
        file = Path(folder) / parts
    target = confinement(folder).escape(file)
    if target is not None:
        raise ImageLoadError(f"{name}: the image path {value!r} is a link out of the dataset's folder {folder} "
                             f"(to {target}); refused")
    return file


# A folder's real path and its subfolders', resolved once per process.
confinement = functools.lru_cache(maxsize=16)(Confinement)


@functools.lru_cache(maxsize=16)
def _image_column(root: str, split: str, column: str) -> Any:
    """The column as a memory-mapped Arrow array (no image decoded, no bytes copied)."""
    return open_dataset(root)[split].with_format("arrow")[column]


def load_hf_dataset(root: str | Path, split: str, image_column: str = "image", caption_column: str = "text",
                    val_fraction: float = 0.05, test_fraction: float = 0.05, split_seed: int = 0,
                    image_root: str | Path | None = None) -> list[ImageRecord]:
    """The records of one split, ids numbering the rows split by split (one split: `seeded_split` divides it)."""
    root = str(root)
    splits = open_dataset(root)
    pools = {ours: key for ours in SPLIT_FOLDERS if (key := _split_key(splits, ours)) is not None}
    seeded = set(pools) == {"train"}
    key = pools["train"] if seeded else pools.get(split)
    if key is None:
        raise DatasetError(f"{root}: no {split} split (the dataset has: {', '.join(splits)}); "
                           f"name one {' or '.join(SPLIT_FOLDERS[split])}")
    captions, captioned = split_captions(root, key, splits[key], image_column, caption_column)
    if seeded:
        drawn = seeded_split(len(captioned), val_fraction, test_fraction, split_seed, f"{root} ({key})")[split]
        rows, first_id = [captioned[i] for i in drawn], 0
    else:
        rows = captioned
        earlier = list(SPLIT_FOLDERS)[: list(SPLIT_FOLDERS).index(split)]
        first_id = sum(len(splits[pools[s]]) for s in earlier if s in pools)  # ids run on across the splits
    images = DatasetImages(root, key, image_column, str(image_root) if image_root is not None else None)
    records = [ImageRecord(first_id + row, Path(root) / key / str(row), captions[row], stored=images, row=row)
               for row in rows]
    if not records and not seeded:  # a drawn split may be empty (a fraction of 0, a tiny dataset)
        raise DatasetError(f"{root} ({key}): the {split} split has no row with a caption in {caption_column!r}")
    return records


def split_captions(root: str, key: str, dataset: Any, image_column: str,
                   caption_column: str) -> tuple[list[tuple[str, ...]], list[int]]:
    """Each row's captions, and the rows that have one; a missing column is one DatasetError naming those there."""
    missing = [c for c in (image_column, caption_column) if c not in dataset.column_names]
    if missing:
        raise DatasetError(f"{root} ({key}): no column {missing[0]!r} (columns: {', '.join(dataset.column_names)}); "
                           f"name yours with data.{'image' if missing[0] == image_column else 'caption'}_column")
    hint = "; name the caption column with data.caption_column"
    captions = [tuple(caption_texts(value, f"{root} ({key}): row {row}: {caption_column!r}", hint)[0])
                for row, value in enumerate(dataset.with_format("arrow")[caption_column].to_pylist())]
    captioned = [row for row, texts in enumerate(captions) if texts]
    if len(captioned) < len(captions):
        log.warning("%s (%s): %d rows have no caption in %r; skipped", root, key, len(captions) - len(captioned),
                    caption_column)
    return captions, captioned


def seeded_split_rows(root: str | Path, image_column: str, caption_column: str, val_fraction: float,
                      test_fraction: float, split_seed: int) -> dict[str, list[int]] | None:
    """The rows of each split when the dataset has one split only (training records them), else None."""
    splits = open_dataset(str(root))
    key = _split_key(splits, "train")
    if key is None or any(_split_key(splits, s) for s in ("val", "test")):
        return None
    _, captioned = split_captions(str(root), key, splits[key], image_column, caption_column)  # read once
    drawn = seeded_split(len(captioned), val_fraction, test_fraction, split_seed, f"{root} ({key})")
    return {split: [captioned[i] for i in positions] for split, positions in drawn.items()}
