"""A WebDataset shard read within the data.max_* limits (docs/reliability.md), member by member. Each size is
checked before its bytes are read; a refusal is one `DatasetError` naming the shard, the member and the limit."""

from __future__ import annotations

import bz2
import collections
import gzip
import io
import lzma
import re
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

from captioner.core.config_sections import DataConfig
from captioner.core.errors import DatasetError
from captioner.core.files import size_text

MAX_HEADER_BYTES = 1 << 20  # a member's header with its GNU long-name and pax records
EXPANSION_CHECKED_FROM = 16 << 20  # decompressed bytes before the expansion guard: small archives vary
READ_AHEAD = 64 << 10  # the tar reader reads 10 KiB records: it may read this far past what it was allowed
KEPT_BYTES = 2 * READ_AHEAD  # the last bytes delivered, kept: the block the reader stopped at is among them
COMPRESSIONS: dict[bytes, Callable[[BinaryIO], BinaryIO]] = {  # first bytes -> the reader that undoes them
    b"\x1f\x8b": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),  # type: ignore[dict-item]
    b"BZh": lambda raw: bz2.BZ2File(raw),  # type: ignore[dict-item]
    b"\xfd7zXZ\x00": lambda raw: lzma.LZMAFile(raw),  # type: ignore[dict-item]
}
META_MEMBER = re.compile(r"__[^/]*__($|/)")  # webdataset's own files (__key__ and the like): never samples
KEY_AND_SUFFIX = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's split of a member name: key, suffix


@dataclass(frozen=True)
class ShardLimits:
    """What reading shards may take (the data.max_* keys of the webdataset section)."""

    member_bytes: int
    shard_bytes: int
    expansion: float
    split_samples: int
    split_bytes: int
    index_bytes: int


def shard_limits(data: DataConfig) -> ShardLimits:
    return ShardLimits(data.max_member_bytes, data.max_shard_bytes, data.max_shard_expansion, data.max_split_samples,
                       data.max_split_bytes, data.max_index_bytes)


DEFAULT_LIMITS = shard_limits(DataConfig())


class LimitReached(Exception):
    """Raised inside the tar reader when the stream passes a limit; `shard_members` words it."""


class CountingReader(io.RawIOBase):
    """The shard's bytes as they arrive (compressed or not), counted."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.raw.read(len(buffer))
        buffer[: len(data)] = data
        self.count += len(data)
        return len(data)


@dataclass(eq=False)
class BoundedStream:
    """The decompressed tar stream, delivered only up to what `allow` allows and the shard's limits."""

    decompressed: BinaryIO
    arrived: CountingReader
    compressed: bool
    limits: ShardLimits
    position: int = 0
    allowed: int = 0
    reason: str = ""  # what the allowance is for, to name when it is passed
    # The last bytes delivered, (start, chunk) each: the block the reader last took for a header is among them.
    recent: collections.deque = field(default_factory=collections.deque)

    def allow(self, end: int, reason: str) -> None:
        self.allowed, self.reason = end, reason

    def block_at(self, offset: int) -> bytes:
        """The delivered bytes [offset, offset + BLOCKSIZE), fewer where the stream ended first."""
        kept = b"".join(chunk for _, chunk in self.recent)
        start = offset - self.recent[0][0] if self.recent else 0
        return kept[start : start + tarfile.BLOCKSIZE] if start >= 0 else b""

    def read(self, size: int = -1) -> bytes:
        room = self.allowed + READ_AHEAD - self.position
        if room <= 0 or size < 0 or size > room:
            size = max(room, 0) + 1  # one byte past the room, so that passing it is seen
        data = self.decompressed.read(size)
        self.recent.append((self.position, data))
        while len(self.recent) > 1 and self.recent[1][0] + KEPT_BYTES <= self.position:
            self.recent.popleft()  # the rest still holds the last KEPT_BYTES
        self.position += len(data)
        if self.position > self.allowed + READ_AHEAD:
            raise LimitReached(self.reason)
        if self.position > self.limits.shard_bytes:
            raise LimitReached(f"more than data.max_shard_bytes ({size_text(self.limits.shard_bytes)}) "
                               "once decompressed")
        if (self.compressed and self.position > EXPANSION_CHECKED_FROM
                and self.position > self.limits.expansion * self.arrived.count):
            raise LimitReached(f"{size_text(self.position)} decompressed from {size_text(self.arrived.count)}, "
                               f"more than data.max_shard_expansion ({self.limits.expansion:g}) times "
                               "(a decompression bomb?)")
        return data


def plain_member_name(name: str) -> bool:
    """A relative name whose parts are all ordinary names ("/x" has an empty one): what a sample's key may be."""
    return ("\\" not in name and not any(ord(c) < 32 or c == "\x7f" for c in name)
            and all(part not in ("", ".", "..") for part in name.split("/")))


def shard_members(raw: BinaryIO, url: str, limits: ShardLimits,
                  wanted: Callable[[str], bool]) -> Iterator[tuple[str, bytes | None]]:
    """(name, data) for each file of the tar stream `raw` in order, data None for those `wanted` refuses."""
    arrived = CountingReader(raw)
    buffered = io.BufferedReader(arrived, READ_AHEAD)
    magic = buffered.peek(8)[:8]
    opener = next((open_ for prefix, open_ in COMPRESSIONS.items() if magic.startswith(prefix)), None)
    stream = BoundedStream(opener(buffered) if opener else buffered,  # type: ignore[arg-type]
                           arrived, opener is not None, limits)
    stream.allow(MAX_HEADER_BYTES,
                 f"its first header: a header (with its long-name and pax records) over {size_text(MAX_HEADER_BYTES)}")
    try:
        tar = tarfile.open(fileobj=stream, mode="r|")  # type: ignore[call-overload]
        while (info := tar.next()) is not None:
            tar.members = []  # a stream keeps every header it read otherwise
            name = info.name
            if not plain_member_name(name):
                raise DatasetError(f"{url}: member {name!r} is not a plain relative name (absolute, '..', '.', "
                                   "an empty part, a backslash or a control character); refused")
            if info.size > limits.member_bytes:
                raise DatasetError(f"{url}: member {name!r} is {size_text(info.size)}, "
                                   f"more than data.max_member_bytes ({size_text(limits.member_bytes)})")
            end = info.offset_data + info.size
            if end > limits.shard_bytes:
                raise DatasetError(f"{url}: member {name!r} ends past data.max_shard_bytes "
                                   f"({size_text(limits.shard_bytes)}) of the shard")
            stream.allow(end, f"member {name!r}: more than its header's {info.size} bytes")
            member = tar.extractfile(info) if info.isreg() and wanted(name) else None
            yield name, None if member is None else member.read()
            stream.allow(end + 2 * tarfile.BLOCKSIZE + MAX_HEADER_BYTES,
                         f"the header after member {name!r}: a header over {size_text(MAX_HEADER_BYTES)}")
    except LimitReached as e:
        raise DatasetError(f"{url}: {e}") from None
    check_archive_end(stream.block_at(tar.offset), tar.offset, url)


def check_archive_end(block: bytes, offset: int, url: str) -> None:
    """Where the tar reader stopped must be tar's end-of-archive (a zero block): it stops as quietly at a
    damaged header or at a stream cut short between members, and the samples after would be lost unsaid."""
    if len(block) < tarfile.BLOCKSIZE:
        raise DatasetError(f"{url}: the shard ends at byte {offset:,} without tar's end-of-archive blocks "
                           "(cut short?)")
    if block.count(0) != len(block):
        raise DatasetError(f"{url}: the header at byte {offset:,} is damaged (not a tar header nor the archive's "
                           "end)")


def member_key(name: str) -> tuple[str, str] | None:
    """webdataset's split of a member name: "dir/000123.seg.png" -> ("dir/000123", "seg.png"), else None."""
    found = KEY_AND_SUFFIX.match(name)
    return (found.group(1), found.group(2).lower()) if found else None


def shard_samples(raw: BinaryIO, url: str, limits: ShardLimits, suffixes: frozenset[str]) -> Iterator[dict]:
    """The samples of one shard as webdataset groups them ({"__key__", "__url__", suffix: bytes}), holding only
    `suffixes`; every key counts as a sample, as in the shard index."""
    sample: dict | None = None
    held: set[str] = set()  # the suffixes of the current sample, read or skipped
    for name, data in shard_members(raw, url, limits, lambda member: (member_key(member) or ("", ""))[1] in suffixes):
        split = member_key(name)
        if split is None or META_MEMBER.match(name):
            continue
        key, suffix = split
        if sample is None or sample["__key__"] != key:
            if sample is not None:
                yield sample
            sample, held = {"__key__": key, "__url__": url}, set()
        if suffix in held:
            raise DatasetError(f"{url}: member {name!r}: a second {suffix!r} of the sample {key!r} "
                               "(a duplicate member)")
        held.add(suffix)
        if data is not None:
            sample[suffix] = data
    if sample is not None:
        yield sample
