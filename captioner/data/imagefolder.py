"""Your own photographs and captions in Hugging Face's `imagefolder` layout, read without `datasets`. A metadata
file names each image (inside its folder) and caption; splits: train/validation/test folders, else `seeded_split`."""

from __future__ import annotations

import csv
import io
import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from captioner.core.bounded_files import Confinement
from captioner.core.errors import DatasetError
from captioner.data.records import ImageRecord, drop_missing, read_text

log = logging.getLogger(__name__)

METADATA_FILES = ("metadata.jsonl", "metadata.csv")
# Our split -> the folder names Hugging Face's loaders accept for it, in the order tried.
SPLIT_FOLDERS = {"train": ("train",), "val": ("validation", "val", "valid", "dev"), "test": ("test",)}


def held_out_count(total: int, fraction: float) -> int:
    """round(total x fraction), at least 1 for a fraction above 0 and three images or more."""
    if fraction <= 0:
        return 0
    return max(1, round(total * fraction)) if total >= 3 else 0


def seeded_split(total: int, val_fraction: float, test_fraction: float, seed: int,
                 source: str) -> dict[str, list[int]]:
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
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}:{number}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{path}:{number}: expected a JSON object per line, got {type(row).__name__}")
        rows.append((number, row))
    return rows


def _csv_rows(path: Path, text: str) -> list[tuple[int, dict]]:
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or "file_name" not in reader.fieldnames:
        raise DatasetError(f"{path}:1: the header has no 'file_name' column "
                           f"(columns: {', '.join(reader.fieldnames or [])})")
    return [(reader.line_num, {k: v for k, v in row.items() if k is not None}) for row in reader]


def _inside(path: Path, line: int, name: str, folder: Confinement) -> str:
    """A file name inside the metadata file's folder: no absolute path, no `..`, no link out of it."""
    parts = PurePosixPath(name.replace("\\", "/"))
    if parts.is_absolute() or ".." in parts.parts:
        raise DatasetError(f"{path}:{line}: file_name {name!r} leaves the image folder "
                           f"(use a path relative to {path.name})")
    target = folder.escape(parts.as_posix())
    if target is not None:
        raise DatasetError(f"{path}:{line}: file_name {name!r} is a link out of the image folder (to {target}); "
                           "refused")
    return parts.as_posix()


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
    if sum(len(v) for v in by_folder.values()) == len(rows.captions) and len(rows.captions) > 0:
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
