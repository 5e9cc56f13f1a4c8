"""The record every dataset loader produces: one image with its reference captions."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from captioner.errors import DatasetError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImageRecord:
    image_id: int  # the id results files and metrics use (COCO's id; Flickr8k: line order)
    path: Path
    captions: tuple[str, ...]


def drop_missing(records: list[ImageRecord], source: str, strict: bool = False) -> list[ImageRecord]:
    """Keep the records whose image exists; log one line with the count of the others.

    A caption file that lists images missing on disk is a real case (a partial download, a
    subset); training on what is there is the useful default, `strict` makes it an error.
    """
    present = [r for r in records if os.path.isfile(r.path)]
    missing = len(records) - len(present)
    if missing:
        example = next(r.path for r in records if not os.path.isfile(r.path))
        message = f"{source}: {missing} of {len(records)} images are missing on disk (e.g. {example})"
        if strict:
            raise DatasetError(message + "; strict mode is on")
        log.warning("%s; skipping them", message)
    if records and not present:
        raise DatasetError(f"{source}: none of the {len(records)} images listed exist under {records[0].path.parent}")
    return present


def check_file(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: {what} not found")
    return path
