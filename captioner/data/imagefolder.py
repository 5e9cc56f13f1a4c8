"""Your own photographs and captions: in Hugging Face's `imagefolder` layout, read without `datasets`, a metadata
file naming each image (inside its folder) and caption; or a Hugging Face dataset on disk (a `save_to_disk` folder
or Parquet files), read with no network, an image path out of the dataset's folder (or `data.image_root`), links
included, refused unread. Splits: train/validation/test folders or splits, else `seeded_split`."""

from __future__ import annotations

import csv
import functools
import io
import json
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from captioner.core.bounded_files import Confinement, check_regular_file, is_within, loads_json
from captioner.core.errors import DatasetError, ImageLoadError
from captioner.data.records import ImageRecord, drop_missing, leaves_folder, read_text

log = logging.getLogger(__name__)

METADATA_FILES = ("metadata.jsonl", "metadata.csv")
# Our split -> the folder names Hugging Face's loaders accept for it, in the order tried.
SPLIT_FOLDERS = {"train": ("train",), "val": ("validation", "val", "valid", "dev"), "test": ("test",)}


def held_out_count(total: int, fraction: float) -> int:
    """round(total x fraction), at least 1 for a fraction above 0 and three images or more."""
    return max(1, round(total * fraction)) if fraction > 0 and total >= 3 else 0


def seeded_split(total: int, val_fraction: float, test_fraction: float, seed: int, source: str) -> dict[str, list[int]]:
    """Positions 0..total-1 -> {train, val, test: sorted positions}: test, val, train in a seeded shuffle."""
    order = list(range(total))
    random.Random(seed).shuffle(order)
    test = held_out_count(total, test_fraction)
    val = held_out_count(total, val_fraction)
    if total - test - val < 1:
        raise DatasetError(f"{source}: {total} images leave none for training after {val} for validation "
                           f"and {test} for testing")
    return {"test": sorted(order[:test]), "val": sorted(order[test : test + val]), "train": sorted(order[test + val :])}


def caption_texts(value: object, where: str, hint: str = "") -> tuple[list[str], int]:
    """A caption cell's texts (a string or a list) and how many it left out (None, blank)."""
    values = value if isinstance(value, list) else [value]
    wrong = next((v for v in values if v is not None and not isinstance(v, str)), None)
    if wrong is not None:
        raise DatasetError(f"{where} holds {type(wrong).__name__} {wrong!r}, not a caption or a list of captions{hint}")
    texts = [v.strip() for v in values if isinstance(v, str) and v.strip()]
    return texts, len(values) - len(texts)


@dataclass(frozen=True)
class Rows:
    """One metadata file, read: image file names in first-seen order with their captions."""

    source: Path
    captions: dict[str, list[str]]  # file name (as written, relative to the file's folder) -> captions
    skipped: int  # rows with no caption (missing, null or empty)


def read_metadata(path: Path, caption_column: str) -> Rows:
    """A metadata.jsonl or metadata.csv -> `Rows`; a malformed row is one DatasetError naming the file and line."""
    text = read_text(path, "image folder metadata file")
    rows = _jsonl_rows(path, text) if path.suffix == ".jsonl" else _csv_rows(path, text)
    captions: dict[str, list[str]] = {}
    skipped = 0
    columns: set[str] = set()
    folder = Confinement(path.parent)
    for line, row in rows:
        columns.update(row)
        name = row.get("file_name")
        if not isinstance(name, str) or not name.strip():
            raise DatasetError(f"{path}:{line}: no 'file_name' (the image's path, relative to {path.name})")
        name = _inside(path, line, name.strip(), folder)
        texts, left_out = caption_texts(row.get(caption_column), f"{path}:{line}: '{caption_column}'")
        captions.setdefault(name, []).extend(texts)
        skipped += left_out
    if not captions:
        raise DatasetError(f"{path}: no rows")
    if caption_column not in columns:
        raise DatasetError(f"{path}: no caption column {caption_column!r} (columns: {', '.join(sorted(columns))}); "
                           "name yours with data.caption_column")
    captioned = {name: texts for name, texts in captions.items() if texts}  # no caption teaches nothing
    if not captioned:
        raise DatasetError(f"{path}: no row has a caption in {caption_column!r}")
    return Rows(path, captioned, skipped)


def _jsonl_rows(path: Path, text: str) -> list[tuple[int, dict]]:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = loads_json(line, f"{path}:{number}", DatasetError)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}:{number}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{path}:{number}: expected a JSON object per line, got {type(row).__name__}")
        rows.append((number, row))
    return rows


def _csv_rows(path: Path, text: str) -> list[tuple[int, dict]]:
    reader = csv.DictReader(io.StringIO(text))
    try:
        if not reader.fieldnames or "file_name" not in reader.fieldnames:
            raise DatasetError(f"{path}:1: the header has no 'file_name' column "
                               f"(columns: {', '.join(reader.fieldnames or [])})")
        return [(reader.line_num, {k: v for k, v in row.items() if k is not None}) for row in reader]
    except csv.Error as e:  # a field past the csv module's limit (128 KiB); the line it was reading
        raise DatasetError(f"{path}:{reader.reader.line_num}: not valid CSV ({e})") from None


def _inside(path: Path, line: int, name: str, folder: Confinement) -> str:
    """A file name inside the metadata file's folder: no absolute path, no `..`, no link out of it."""
    if leaves_folder(name):
        raise DatasetError(f"{path}:{line}: file_name {name!r} leaves the image folder "
                           f"(use a path relative to {path.name})")
    posix = PurePosixPath(name.replace("\\", "/")).as_posix()
    if (target := folder.escape(posix)) is not None:
        raise DatasetError(f"{path}:{line}: file_name {name!r} is a link out of the image folder (to {target}); "
                           "refused")
    return posix


def metadata_file(folder: Path) -> Path | None:
    return next((folder / name for name in METADATA_FILES if (folder / name).is_file()), None)


def load_imagefolder(root: str | Path, split: str, caption_column: str = "text", val_fraction: float = 0.05,
                     test_fraction: float = 0.05, split_seed: int = 0, check_images: bool = True,
                     strict: bool = False, max_missing: float = 1.0) -> list[ImageRecord]:
    """The records of one split; image ids number the folder's images split by split, in metadata order."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"{root}: image folder not found" if not root.exists() else f"{root}: not a folder")
    pools = _pools(root, caption_column)
    if set(pools) == {"all"}:
        rows = pools["all"]
        names = list(rows.captions)
        chosen = seeded_split(len(names), val_fraction, test_fraction, split_seed, str(rows.source))[split]
        records = [ImageRecord(i, rows.source.parent / names[i], tuple(rows.captions[names[i]])) for i in chosen]
    else:
        if split not in pools:
            raise DatasetError(f"{root}: no {split} split (found: {', '.join(pools)}); add a "
                               f"{'/'.join(SPLIT_FOLDERS[split])} folder with its metadata file")
        earlier = list(SPLIT_FOLDERS)[: list(SPLIT_FOLDERS).index(split)]
        first_id = sum(len(pools[s].captions) for s in earlier if s in pools)  # ids run on across the splits
        rows = pools[split]
        records = [ImageRecord(first_id + i, rows.source.parent / n, tuple(c))
                   for i, (n, c) in enumerate(rows.captions.items())]
    if rows.skipped:
        log.warning("%s: %d rows have no caption in %r; skipped", rows.source, rows.skipped, caption_column)
    return drop_missing(records, str(rows.source), strict, max_missing) if check_images else records


def _pools(root: Path, caption_column: str) -> dict[str, Rows]:
    """Split -> its rows (split folders, or a root file's names under them), else {'all': the root file's}."""
    files = {split: next((f for n in names if (f := metadata_file(root / n)) is not None), None)
             for split, names in SPLIT_FOLDERS.items()}
    if any(files.values()):
        return {split: read_metadata(file, caption_column) for split, file in files.items() if file is not None}
    path = metadata_file(root)
    if path is None:
        raise DatasetError(f"{root}: no metadata.jsonl or metadata.csv (file_name and {caption_column!r} columns) "
                           "here or in train/, validation/, test/")
    rows = read_metadata(path, caption_column)
    by_folder = {split: {n: c for n, c in rows.captions.items() if n.split("/", 1)[0] in names}
                 for split, names in SPLIT_FOLDERS.items()}
    if sum(len(v) for v in by_folder.values()) == len(rows.captions):  # read_metadata refuses a file with none
        return {split: Rows(path, captions, rows.skipped) for split, captions in by_folder.items() if captions}
    return {"all": rows}


def seeded_split_files(root: str | Path, caption_column: str, val_fraction: float, test_fraction: float,
                       split_seed: int) -> dict[str, list[str]] | None:
    """The file names of each split when the folder has no split folders (training records them), else None."""
    pools = _pools(Path(root), caption_column)
    if set(pools) != {"all"}:
        return None
    rows = pools["all"]
    names = list(rows.captions)
    splits = seeded_split(len(names), val_fraction, test_fraction, split_seed, str(rows.source))
    return {split: [names[i] for i in positions] for split, positions in splits.items()}


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
                check_regular_file(file, "image", ImageLoadError)  # a pipe's reader would wait for a writer
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
    if (target := confinement(folder).escape(file)) is not None:
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
