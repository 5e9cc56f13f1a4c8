"""WebDataset shards, as img2dataset writes them (`<key>.jpg`, `.txt`, `.json`): written from any dataset the project
reads, atomically, with a `shards.json` wids index of sample counts, so a reader knows an epoch's length unopened;
and read: each shard's sample count, the samples within limits, their fields, a split whole. Shards are read from
a brace pattern of paths, URLs or `pipe:` commands; counts from `shards.json` or `<shard>_stats.json`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captioner.core.bounded_files import check_regular_file
from captioner.core.errors import DatasetError, ImageLoadError
from captioner.core.files import size_text, write_atomically
from captioner.core.progress import progress_bar
from captioner.data.bounded_tar import DEFAULT_LIMITS, ShardLimits, shard_samples
from captioner.data.image_files import open_checked
from captioner.data.records import ImageRecord, image_data, is_int

log = logging.getLogger(__name__)

INDEX = "shards.json"
# Pillow format -> file suffix
EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tif"}
IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff")
READ_SUFFIXES = frozenset((*IMAGE_SUFFIXES, "txt", "json"))  # a sample's members that are read; others skipped
SHARD_NAME = re.compile(r"([^/\s]+)\.tar\b")  # a shard's file name inside a path, URL or pipe: command
TIMEOUT = 30  # seconds an index read over HTTP waits for an answer
READ_PIECE = 1 << 20  # an index is read in pieces of this many bytes


class BrokenSample(Exception):
    """A sample that cannot be trained on: skipped and counted, never fatal below the limit."""


@dataclass(frozen=True)
class ShardSet:
    """The shards of one split and each one's sample count."""

    pattern: str
    urls: tuple[str, ...]
    counts: tuple[int, ...]
    limits: ShardLimits = DEFAULT_LIMITS

    @property
    def samples(self) -> int:
        return sum(self.counts)


def open_shard_set(pattern: str, what: str, limits: ShardLimits = DEFAULT_LIMITS) -> ShardSet:
    """The shards `pattern` names (braces expanded) with their counts, read within `limits`."""
    from webdataset.shardlists import expand_urls  # the 'data' extra

    urls = tuple(u for u in expand_urls(pattern.strip()) if u)
    if not urls:
        raise DatasetError(f"{what}: {pattern!r} names no shards")
    return ShardSet(pattern, urls, tuple(shard_counts(urls, what, limits.index_bytes)), limits)


def shard_counts(urls: Iterable[str], what: str, max_bytes: int = DEFAULT_LIMITS.index_bytes) -> list[int]:
    """Each shard's sample count: from the shards.json beside it, else from its `<shard>_stats.json`."""
    indexes: dict[str, dict[str, int] | None] = {}
    counts = []
    for url in urls:
        names = SHARD_NAME.findall(url)
        if not names:
            raise DatasetError(f"{what}: {url!r} is not a .tar shard")
        shard_file = names[-1] + ".tar"
        index_url = sibling(url, shard_file, INDEX)
        if index_url not in indexes:
            indexes[index_url] = read_index(index_url, max_bytes)
        listed = indexes[index_url]
        if listed is not None and shard_file in listed:
            counts.append(listed[shard_file])
            continue
        stats_url = sibling(url, shard_file, names[-1] + "_stats.json")
        stats = read_small(stats_url, "the shard's sample count", max_bytes)
        if stats is None:
            where = f"{index_url} does not list it" if listed is not None else f"no {INDEX} at {index_url}"
            raise DatasetError(f"{url}: the shard's sample count is unknown ({where}, and no {stats_url}); "
                               "write the index with captioner data shards, or keep img2dataset's _stats.json files")
        try:
            counts.append(int(json.loads(stats)["successes"]))
        except (ValueError, KeyError, TypeError, RecursionError):
            raise DatasetError(f"{stats_url}: not an img2dataset stats file (no integer 'successes')") from None
    return counts


def sibling(url: str, shard_file: str, name: str) -> str:
    """`url` with its (last) shard file name replaced by `name`: the file beside the shard, read the same way."""
    at = url.rfind(shard_file)
    return url[:at] + name + url[at + len(shard_file):]


def read_index(url: str, max_bytes: int = DEFAULT_LIMITS.index_bytes) -> dict[str, int] | None:
    """A wids index's shard file names -> sample counts, or None when there is none at `url`."""
    data = read_small(url, "the shard index", max_bytes)
    if data is None:
        return None
    try:
        shards = json.loads(data)["shardlist"]
        return {Path(str(s["url"])).name: int(s["nsamples"]) for s in shards}
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: nested past Python's limit
        raise DatasetError(f"{url}: not a shard index "
                           "(a JSON object whose 'shardlist' has 'url' and 'nsamples' per shard)") from None


def read_small(url: str, what: str, max_bytes: int = DEFAULT_LIMITS.index_bytes) -> bytes | None:
    """A file beside the shards (path, URL, pipe: command) of at most `max_bytes`; None if absent."""
    if url.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
                return at_most(read_at_most(response, max_bytes), max_bytes, url, what)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise DatasetError(f"{url}: {what}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", None) or e
            raise DatasetError(f"{url}: {what}: the server does not answer ({reason})") from None
    if url.startswith("pipe:"):
        try:
            data = command_output(url, max_bytes)
        except Exception:  # the command's own failure: a missing file and a dead host look alike here
            return None
        return at_most(data, max_bytes, url, what)
    path = Path(url.removeprefix("file://"))
    if not path.exists():
        return None
    try:
        check_regular_file(path, what, DatasetError)  # a pipe's reader would wait for a writer
        with open(path, "rb") as file:
            return at_most(read_at_most(file, max_bytes), max_bytes, str(path), what)
    except OSError as e:
        raise DatasetError(f"{path}: cannot read {what} ({e.strerror or e})") from None


def command_output(url: str, max_bytes: int) -> bytes:
    """At most `max_bytes` + 1 bytes of a pipe: command's output; one that writes more is killed, not waited for."""
    from webdataset.gopen import gopen

    command = gopen(url)
    data = read_at_most(command, max_bytes)
    if len(data) > max_bytes:
        command.proc.kill()
        command.proc.wait()
        command.stream.close()
    else:
        command.close()  # waits for the command; its failure raises
    return data


def read_at_most(stream: Any, max_bytes: int) -> bytes:
    """Up to `max_bytes` + 1 bytes of `stream`, in pieces (a read reserves the whole size asked for at once)."""
    data = bytearray()
    while len(data) <= max_bytes and (piece := stream.read(min(READ_PIECE, max_bytes + 1 - len(data)))):
        data += piece
    return bytes(data)


def at_most(data: bytes, max_bytes: int, where: str, what: str) -> bytes:
    if len(data) > max_bytes:
        raise DatasetError(f"{where}: {what} is larger than data.max_index_bytes ({size_text(max_bytes)}); refused")
    return data


def read_samples(urls: Iterable[str], limits: ShardLimits = DEFAULT_LIMITS) -> Iterator[dict]:
    """The shards' samples in order, as webdataset groups them, within `limits`; an unreadable one: DatasetError."""
    from webdataset.gopen import gopen  # the 'data' extra

    for url in urls:
        stream = None
        try:
            stream = gopen(url)
            yield from shard_samples(stream, url, limits, READ_SUFFIXES)
        except DatasetError:
            raise
        except Exception as e:  # a curl or pipe exit, a truncated tar or gzip, a missing file: named
            detail = (str(e.args[0] if e.args else e).splitlines() or [""])[0][:200]
            raise DatasetError(f"{url}: the shard cannot be read ({type(e).__name__}: {detail})") from None
        finally:
            if stream is not None:
                release(stream)


def release(stream: object) -> None:
    """Close a shard's stream, killing a command still writing (its exit status then says nothing)."""
    process = getattr(stream, "proc", None)
    if process is not None and process.poll() is None:
        process.kill()
    with contextlib.suppress(Exception):
        stream.close()  # type: ignore[attr-defined]


def sample_captions(sample: dict) -> list[str]:
    """A sample's captions: its JSON's "captions" list or "caption", else its .txt."""
    if "json" in sample:
        try:
            meta = json.loads(sample["json"])
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested past Python's limit
            raise BrokenSample("its .json is not valid JSON") from None
        found = meta.get("captions") or meta.get("caption") if isinstance(meta, dict) else None
        captions = [found] if isinstance(found, str) else found if isinstance(found, list) else []
        captions = [c for c in captions if isinstance(c, str) and c.strip()]
        if captions:
            return captions
    if "txt" in sample:
        try:
            text = sample["txt"].decode("utf-8").strip()
        except UnicodeDecodeError:
            raise BrokenSample("its .txt is not UTF-8") from None
        if text:
            return [text]
    raise BrokenSample("no caption (.txt or .json)")


def sample_image(sample: dict) -> bytes:
    for suffix in IMAGE_SUFFIXES:
        if suffix in sample:
            return sample[suffix]
    raise BrokenSample("no image (.jpg, .png, .webp, ...)")


def sample_name(sample: dict) -> str:
    return f"{sample.get('__url__', '?')}#{sample.get('__key__', '?')}"


def shard_captions(shards: ShardSet, progress: bool = True) -> Iterator[str]:
    """Every caption in the shards, for the vocabulary: one pass over the shards that decodes no image."""
    for sample in progress_bar(read_samples(shards.urls, shards.limits), total=shards.samples, desc="captions",
                               unit="sample", enabled=progress):
        try:
            yield from sample_captions(sample)
        except BrokenSample:
            continue


def load_shard_records(shards: ShardSet, split: str, keep_images: bool = True) -> list[ImageRecord]:
    """A split read whole: a record per sample with an image and a caption (bytes kept with `keep_images`), within
    data.max_split_samples and data.max_split_bytes."""
    images: list[bytes] = []
    stored = InMemoryImages(images) if keep_images else None  # one for the split: each record reads its row
    records: list[ImageRecord] = []
    broken, held = 0, 0  # held: the bytes kept in memory
    limits = shards.limits
    for sample in read_samples(shards.urls, limits):
        try:
            captions, image = sample_captions(sample), sample_image(sample)
        except BrokenSample:
            broken += 1
            continue
        if keep_images or split != "train":  # held whole: a validation or test split, any split with its images
            held += (len(image) if keep_images else 0) + sum(len(c) for c in captions)
            if len(records) >= limits.split_samples:
                raise DatasetError(f"{sample_name(sample)}: the {split} split holds more than "
                                   f"data.max_split_samples ({limits.split_samples:,}) samples; refused")
            if held > limits.split_bytes:
                raise DatasetError(f"{sample_name(sample)}: the {split} split takes more than "
                                   f"data.max_split_bytes ({size_text(limits.split_bytes)}) in memory; refused")
        records.append(ImageRecord(sample_image_id(sample, len(records)), Path(split) / sample["__key__"],
                                   tuple(captions), stored=stored, row=len(images)))
        if keep_images:
            images.append(image)
    if broken:
        log.warning("%s: %d of %d samples have no image or caption; left out", shards.pattern, broken,
                    broken + len(records))
    if not records:
        raise DatasetError(f"{shards.pattern}: no sample with an image and a caption")
    return records


def sample_image_id(sample: dict, position: int) -> int:
    """The sample's image id: its JSON's "image_id" when there is one, else its position."""
    try:
        found = json.loads(sample["json"]).get("image_id") if "json" in sample else None
    except (ValueError, UnicodeDecodeError, AttributeError, RecursionError):
        found = None
    return found if is_int(found) else position


@dataclass(eq=False)
class InMemoryImages:
    """A split's image bytes, read by row (records.StoredImages)."""

    images: list[bytes]

    def read(self, row: int) -> bytes:
        return self.images[row]


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
        if isinstance(source, bytes):
            data = source
        else:
            check_regular_file(Path(source), "image", ImageLoadError)  # a pipe's reader would wait for a writer
            data = Path(source).read_bytes()
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

    # mtime 0: the same dataset, the same bytes
    with open(path, "wb") as stream, webdataset.TarWriter(stream, encoder=False, mtime=0) as writer:
        for item in samples:
            writer.write(item)


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
