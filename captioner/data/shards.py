"""Any dataset the project reads -> WebDataset shards, as img2dataset writes them (`<key>.jpg`, `.txt`, `.json`).
Written atomically, with a `shards.json` wids index of sample counts: a reader knows an epoch's length unopened."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from captioner.core.errors import ImageLoadError
from captioner.core.files import write_atomically
from captioner.core.progress import progress_bar
from captioner.data.image_files import open_checked
from captioner.data.records import ImageRecord, image_data

log = logging.getLogger(__name__)

# Pillow format -> file suffix
EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tif"}
INDEX = "shards.json"


@dataclass
class ShardSummary:
    folder: Path
    shards: list[dict] = field(default_factory=list)  # {"url": file name, "nsamples": n, "filesize": bytes}
    skipped: list[str] = field(default_factory=list)  # the images left out, each with why

    @property
    def samples(self) -> int:
        return sum(s["nsamples"] for s in self.shards)


def image_bytes(record: ImageRecord) -> tuple[bytes, str]:
    """The image's bytes as stored and its file suffix, after the loader's header checks (else ImageLoadError)."""
    source = image_data(record)
    try:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
    except OSError as e:
        raise ImageLoadError(f"{source}: cannot read it ({e.strerror or e})") from None
    image_format = open_checked(data, lambda image: image.format, name=str(record.path))
    return data, EXTENSIONS[image_format]


def sample(key: str, record: ImageRecord, data: bytes, suffix: str) -> dict[str, object]:
    """One sample in img2dataset's layout, as webdataset's TarWriter takes it (bytes, unencoded)."""
    meta = {"key": key, "caption": record.captions[0], "captions": list(record.captions), "image_id": record.image_id,
            "source": str(record.path)}
    return {"__key__": key, suffix: data, "txt": record.captions[0].encode(), "json": json.dumps(meta).encode()}


def write_tar(path: Path, samples: list[dict[str, object]]) -> None:
    import webdataset  # the 'data' extra

    with open(path, "wb") as stream:
        writer = webdataset.TarWriter(stream, encoder=False, mtime=0)  # mtime 0: the same dataset, the same bytes
        for item in samples:
            writer.write(item)
        writer.close()


def write_shards(records: list[ImageRecord], folder: str | Path, max_count: int = 1000, max_bytes: int = 1_000_000_000,
                 progress: bool = True, description: str = "shards") -> ShardSummary:
    """`records` as shards of at most `max_count` samples and about `max_bytes` bytes, and `shards.json`."""
    folder = Path(folder)
    summary = ShardSummary(folder)
    pending: list[dict[str, object]] = []
    size = 0

    def close_shard() -> None:
        nonlocal pending, size
        if not pending:
            return
        path = folder / f"{len(summary.shards):05d}.tar"
        write_atomically(path, lambda tmp: write_tar(tmp, pending))
        summary.shards.append({"url": path.name, "nsamples": len(pending), "filesize": path.stat().st_size})
        pending, size = [], 0

    for record in progress_bar(records, desc=description, unit="img", enabled=progress):
        try:
            data, suffix = image_bytes(record)
        except ImageLoadError as e:
            summary.skipped.append(str(e))
            log.warning("left out of the shards: %s", e)
            continue
        pending.append(sample(f"{record.image_id:09d}", record, data, suffix))  # the id: unique across the splits
        size += len(data)
        if len(pending) >= max_count or size >= max_bytes:
            close_shard()
    close_shard()
    index = {"wids_version": 1, "name": folder.name, "shardlist": summary.shards, "skipped": len(summary.skipped)}
    write_atomically(folder / INDEX, lambda tmp: tmp.write_text(json.dumps(index, indent=1)))
    return summary


def existing_shards(folder: Path) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.endswith(".tar")) if folder.is_dir() else []
