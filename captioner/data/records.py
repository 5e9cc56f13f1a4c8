"""The record every dataset loader produces: one image with its reference captions."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

from captioner.core.bounded_files import loads_json, read_text_file
from captioner.core.errors import DatasetError

log = logging.getLogger(__name__)


class StoredImages(Protocol):
    """Images kept in a dataset's own files (Arrow, Parquet), read by row; picklable for DataLoader workers."""

    def read(self, row: int) -> bytes: ...


@dataclass(frozen=True)
class ImageRecord:
    image_id: int  # the id results files and metrics use (COCO's id; Flickr8k: line order)
    path: Path  # the image file; for a stored image, a name for it: <dataset>/<split>/<row>
    captions: tuple[str, ...]
    stored: StoredImages | None = None  # set when the image's bytes live in the dataset's files
    row: int = 0  # the row of `stored` that holds it


def image_data(record: ImageRecord) -> Path | bytes:
    """What the image loader reads for `record`: its file, or its stored bytes."""
    return record.path if record.stored is None else record.stored.read(record.row)


def record_exists(record: ImageRecord) -> bool:
    return record.stored is not None or os.path.isfile(record.path)


def drop_missing(records: list[ImageRecord], source: str, strict: bool = False,
                 max_missing: float = 1.0) -> list[ImageRecord]:
    """Keep the records whose image exists, warning of the others; refuse past `max_missing` (a share), or any
    with `strict`: a partial copy would quietly be another dataset."""
    present = [r for r in records if record_exists(r)]
    missing = len(records) - len(present)
    if records and not present:  # a moved or deleted image folder: the key that points at it
        raise DatasetError(f"{source}: none of the {len(records)} images listed exist under "
                           f"{records[0].path.parent}; point data.root (or data.image_root, "
                           "where the images lie apart from the captions) at them")
    if missing:
        example = next(r.path for r in records if not record_exists(r))
        message = f"{source}: {missing} of {len(records)} images are missing on disk (e.g. {example})"
        if strict:
            raise DatasetError(message + "; strict mode is on")
        if missing / len(records) > max_missing:
            raise DatasetError(f"{message}: {missing / len(records):.1%}, more than data.max_missing_fraction "
                               f"({max_missing:g}) allows; fetch them or point data.image_root at them, or set "
                               f"data.max_missing_fraction=1 to use the {len(present)} there")
        log.warning("%s; skipping them", message)
    return present


def check_file(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: {what} not found")
    return path


def read_text(path: str | Path, what: str) -> str:
    """A text file's contents; a missing, unreadable or non-UTF-8 file is one DatasetError, and so is a folder
    or a named pipe (whose read would wait forever for a writer). A leading byte order mark, which Excel and
    Notepad write, is no part of the text: kept, it became part of a CSV's first column name or an image's name."""
    path = check_file(path, what)
    try:
        return read_text_file(path, what, DatasetError).removeprefix("\ufeff")
    except FileNotFoundError:  # gone since it was checked
        raise DatasetError(f"{path}: {what} not found") from None


def read_json(path: str | Path, what: str) -> object:
    """A JSON file's value; a truncated or otherwise invalid file names the line and column, one nested too deep
    or holding a number too long to convert says so."""
    try:
        return loads_json(read_text(path, what), str(path), DatasetError)
    except json.JSONDecodeError as e:
        raise DatasetError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                           "truncated?") from None


def leaves_folder(name: str) -> bool:
    """Whether an image's name, read as a path below its dataset's image folder, leads out of it: an absolute
    path or a `..` part (either slash). Links below the folder are the user's own, followed."""
    path = PurePosixPath(name.replace("\\", "/"))
    return path.is_absolute() or ".." in path.parts


def leading_out(name: str, said: str, image_root: str | Path | None = None) -> DatasetError:
    """The one-line error for an image name that `leaves_folder`: `said` names the entry ("FILE: images[3]:
    file_name"), `image_root` the folder it leads out of where the loader knows it."""
    folder = "" if image_root is None else f" {image_root}"
    return DatasetError(f"{said} {name!r} leads out of the image folder{folder} (an absolute path or '..'); refused")


def is_int(value: object) -> bool:
    """An integer id (JSON true/false are not ids)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """An int or a float read from JSON or a checkpoint (true/false are not numbers)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
