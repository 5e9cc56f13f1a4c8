"""WebDataset shards streamed to training: each rank and DataLoader worker reads its own shards,
an epoch sees every sample once, and a resumed run continues where the killed one stopped.

The shards are what img2dataset (or `captioner data shards`) writes: `00000.tar` holding
`key.jpg` (or .png/.webp), `key.txt` and optionally `key.json` (with "captions", a list, or
"caption"). They are given as a brace pattern of local paths, http(s) URLs or `pipe:` commands
(`https://host/cc3m/{00000..00331}.tar`), opened with webdataset's `gopen` and read member by
member within limits (`bounded_tar`: a member's size, a shard's decompressed bytes, names that stay
relative); nothing is copied to disk. Only the user's own config names shards: a model's stored
config never does (`model_settings`), since a `pipe:` pattern is a shell command.

An epoch needs each shard's sample count before it starts, so that every rank takes the same
number of steps (DDP waits for all of them at each step): from the `shards.json` beside the
shards (the wids index `captioner data shards` writes) or img2dataset's `<shard>_stats.json`.

The epoch's plan is a pure function of (seed, epoch, world size, workers):
- the shards are permuted; rank r takes every world-th shard from r, its worker w every
  workers-th of those from w, read in that order through a seeded shuffle buffer;
- worker (r, w) yields floor((n - reserve) / batch) batches of its n samples, where
  reserve = ceil(data.max_broken_fraction x n) is kept for samples that turn out broken (a bad
  image, no caption): they are skipped and counted, and one more than the reserve stops the run;
- every rank then takes the fewest steps any rank has (its largest workers give up batches).
So in an epoch no sample is seen twice, and each worker leaves out fewer than batch + reserve of
its samples, plus the imbalance between ranks (docs/training.md).

Resume: each worker's position is (batches yielded, samples drawn from its shuffle buffer,
broken so far), recorded for the batches the training loop has taken. A resumed worker replays
its stream without decoding images up to that position, so the epoch goes on with the same
samples in the same batches, none repeated and none skipped; only the interleaving of the
workers' batches may differ from the killed run's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from captioner.core.errors import DatasetError, ImageLoadError
from captioner.core.files import size_text
from captioner.data.batching import CaptionBatch, collate_captions
from captioner.data.bounded_tar import DEFAULT_LIMITS, ShardLimits, shard_samples
from captioner.data.image_files import load_image
from captioner.data.image_transform import ImageTransform
from captioner.data.records import ImageRecord, is_int
from captioner.data.sampler import DRAW_LIMIT, epoch_seed
from captioner.data.shards import INDEX
from captioner.text.vocab import Vocabulary

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff")
READ_SUFFIXES = frozenset((*IMAGE_SUFFIXES, "txt", "json"))  # a sample's members that are read; the others are skipped unread
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
    """The shards `pattern` names (braces expanded) with their counts, read within `limits`
    (`shard_limits(config.data)`); DatasetError in one line for an empty list, an index that does
    not answer or a shard it does not count."""
    from webdataset.shardlists import expand_urls  # the 'data' extra

    urls = tuple(u for u in expand_urls(pattern.strip()) if u)
    if not urls:
        raise DatasetError(f"{what}: {pattern!r} names no shards")
    return ShardSet(pattern, urls, tuple(shard_counts(urls, what, limits.index_bytes)), limits)


def shard_counts(urls: Iterable[str], what: str, max_bytes: int = DEFAULT_LIMITS.index_bytes) -> list[int]:
    """Each shard's sample count: from the shards.json beside it (read once per folder), else
    from img2dataset's `<shard>_stats.json`; neither may be over `max_bytes`."""
    indexes: dict[str, dict[str, int] | None] = {}
    counts = []
    for url in urls:
        name = shard_name(url, what)
        index_url = sibling(url, name + ".tar", INDEX)
        if index_url not in indexes:
            indexes[index_url] = read_index(index_url, max_bytes)
        listed = indexes[index_url]
        if listed is not None and name + ".tar" in listed:
            counts.append(listed[name + ".tar"])
            continue
        stats_url = sibling(url, name + ".tar", name + "_stats.json")
        stats = read_small(stats_url, "the shard's sample count", max_bytes, missing_ok=True)
        if stats is None:
            where = f"{index_url} does not list it" if listed is not None else f"no {INDEX} at {index_url}"
            raise DatasetError(f"{url}: the shard's sample count is unknown ({where}, and no {stats_url}); write the index with captioner data shards, or keep img2dataset's _stats.json files")
        try:
            counts.append(int(json.loads(stats)["successes"]))
        except (ValueError, KeyError, TypeError):
            raise DatasetError(f"{stats_url}: not an img2dataset stats file (no integer 'successes')") from None
    return counts


def shard_name(url: str, what: str) -> str:
    found = SHARD_NAME.findall(url)
    if not found:
        raise DatasetError(f"{what}: {url!r} is not a .tar shard")
    return found[-1]


def sibling(url: str, shard_file: str, name: str) -> str:
    """`url` with its (last) shard file name replaced by `name`: the file beside the shard, read the
    same way (path, URL, or the same pipe: command)."""
    at = url.rfind(shard_file)
    return url[:at] + name + url[at + len(shard_file):]


def read_index(url: str, max_bytes: int = DEFAULT_LIMITS.index_bytes) -> dict[str, int] | None:
    """A wids index's shard file names -> sample counts, or None when there is none at `url`."""
    data = read_small(url, "the shard index", max_bytes, missing_ok=True)
    if data is None:
        return None
    try:
        shards = json.loads(data)["shardlist"]
        return {Path(str(s["url"])).name: int(s["nsamples"]) for s in shards}
    except (ValueError, KeyError, TypeError):
        raise DatasetError(f"{url}: not a shard index (a JSON object whose 'shardlist' has 'url' and 'nsamples' per shard)") from None


def read_small(url: str, what: str, max_bytes: int = DEFAULT_LIMITS.index_bytes, missing_ok: bool = False) -> bytes | None:
    """A small file beside the shards: a path, a file:// or http(s) URL, or a pipe: command, of at
    most `max_bytes` (data.max_index_bytes). None when it is not there and `missing_ok`;
    DatasetError when the place does not answer or the file is larger."""
    if url.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
                return at_most(read_at_most(response, max_bytes), max_bytes, url, what)
        except urllib.error.HTTPError as e:
            if e.code == 404 and missing_ok:
                return None
            raise DatasetError(f"{url}: {what}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", None) or e
            raise DatasetError(f"{url}: {what}: the server does not answer ({reason})") from None
    if url.startswith("pipe:"):
        try:
            data = command_output(url, max_bytes)
        except Exception:  # the command's own failure: a missing file and a dead host look alike here
            if missing_ok:
                return None
            raise DatasetError(f"{url}: {what}: the command failed") from None
        return at_most(data, max_bytes, url, what)
    path = Path(url.removeprefix("file://"))
    if not path.exists() and missing_ok:
        return None
    try:
        with open(path, "rb") as file:
            return at_most(read_at_most(file, max_bytes), max_bytes, str(path), what)
    except OSError as e:
        raise DatasetError(f"{path}: cannot read {what} ({e.strerror or e})") from None


def command_output(url: str, max_bytes: int) -> bytes:
    """At most `max_bytes` + 1 bytes of a pipe: command's output; a command that writes more is
    stopped there, not read to its end (nor waited for: it may never end)."""
    from webdataset.gopen import gopen

    command = gopen(url)
    data = read_at_most(command, max_bytes)
    if len(data) > max_bytes:
        command.proc.kill()
        command.proc.wait()
        command.stream.close()
        return data
    command.close()  # waits for the command; its failure raises
    return data


def read_at_most(stream: Any, max_bytes: int) -> bytes:
    """Up to `max_bytes` + 1 bytes of `stream`, read in pieces (a file, an HTTP response and a pipe
    each reserve the whole size asked for at once)."""
    pieces: list[bytes] = []
    total = 0
    while total <= max_bytes:
        piece = stream.read(min(READ_PIECE, max_bytes + 1 - total))
        if not piece:
            break
        pieces.append(piece)
        total += len(piece)
    return b"".join(pieces)


def at_most(data: bytes, max_bytes: int, where: str, what: str) -> bytes:
    if len(data) > max_bytes:
        raise DatasetError(f"{where}: {what} is larger than data.max_index_bytes ({size_text(max_bytes)}); refused")
    return data


@dataclass(frozen=True)
class EpochPlan:
    """Which shards each (rank, worker) reads in an epoch, in order, and how many batches it yields."""

    shards: tuple[tuple[tuple[int, ...], ...], ...]  # [rank][worker] -> shard indices
    batches: tuple[tuple[int, ...], ...]  # [rank][worker] -> batches yielded
    reserve: tuple[tuple[int, ...], ...]  # [rank][worker] -> broken samples allowed

    @property
    def steps(self) -> int:
        return sum(self.batches[0])


def plan_epoch(counts: tuple[int, ...], seed: int, epoch: int, world: int, workers: int, batch_size: int,
               max_broken: float) -> EpochPlan:
    """The epoch's plan (the module's docstring): every rank takes the same number of steps."""
    order = random.Random(epoch_seed(seed, epoch)).sample(range(len(counts)), len(counts))
    shards = tuple(tuple(tuple(order[r::world][w::workers]) for w in range(workers)) for r in range(world))
    sizes = [[sum(counts[i] for i in mine) for mine in rank] for rank in shards]
    reserve = [[math.ceil(max_broken * n) for n in rank] for rank in sizes]
    batches = [[max(0, n - k) // batch_size for n, k in zip(rank, kept)] for rank, kept in zip(sizes, reserve)]
    steps = min(sum(rank) for rank in batches)
    for rank in batches:  # the largest workers give up batches until the rank has `steps`
        for _ in range(sum(rank) - steps):
            largest = max(range(workers), key=lambda w: (rank[w], w))
            rank[largest] -= 1
    return EpochPlan(shards, tuple(map(tuple, batches)), tuple(map(tuple, reserve)))


def read_samples(urls: Iterable[str], limits: ShardLimits = DEFAULT_LIMITS) -> Iterator[dict]:
    """The samples of the shards in order, as webdataset groups a tar's files by key: {"__key__",
    "__url__", suffix: bytes, ...} (the suffixes read: images, .txt, .json), each shard read within
    `limits` (`bounded_tar`). A shard that cannot be opened or read is one DatasetError."""
    from webdataset.gopen import gopen  # the 'data' extra

    for url in urls:
        stream = None
        try:
            stream = gopen(url)
            yield from shard_samples(stream, url, limits, READ_SUFFIXES)
        except DatasetError:
            raise
        except Exception as e:  # a curl or pipe exit, a truncated tar or gzip, a missing file: the shard is named
            detail = (str(e.args[0] if e.args else e).splitlines() or [""])[0][:200]
            raise DatasetError(f"{url}: the shard cannot be read ({type(e).__name__}: {detail})") from None
        finally:
            if stream is not None:
                release(stream)


def release(stream: object) -> None:
    """Close a shard's stream. A command still writing (its reader stopped early, or at the tar's
    end before its padding) is stopped: its exit status after that says nothing about the shard."""
    process = getattr(stream, "proc", None)
    if process is not None and process.poll() is None:
        process.kill()
    with contextlib.suppress(Exception):
        stream.close()  # type: ignore[attr-defined]


def shuffled(samples: Iterable[dict], size: int, rng: random.Random) -> Iterator[dict]:
    """A shuffle buffer of `size` samples (webdataset's kind): each sample read replaces a random
    one of the buffer, which is yielded; the rest come out shuffled at the end."""
    buffer: list[dict] = []
    for sample in samples:
        if len(buffer) < size:
            buffer.append(sample)
            continue
        j = rng.randrange(size)
        yield buffer[j]
        buffer[j] = sample
    rng.shuffle(buffer)
    yield from buffer


def sample_captions(sample: dict) -> list[str]:
    """A sample's captions: its JSON's "captions" list or "caption", else its .txt."""
    if "json" in sample:
        try:
            meta = json.loads(sample["json"])
        except (ValueError, UnicodeDecodeError):
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
    from captioner.core.progress import progress_bar

    for sample in progress_bar(read_samples(shards.urls, shards.limits), total=shards.samples, desc="captions", unit="sample", enabled=progress):
        try:
            yield from sample_captions(sample)
        except BrokenSample:
            continue


def load_shard_records(shards: ShardSet, split: str, keep_images: bool = True) -> list[ImageRecord]:
    """A split read whole into memory (validation and test sets are small): one record per
    sample with an image and a caption, its image bytes kept unless `keep_images` is False (the
    captions alone: statistics, a model card); the others are counted in one warning. A split held
    whole (validation, test, or any with its images) stops past data.max_split_samples samples or
    data.max_split_bytes bytes of images and captions."""
    images: list[bytes] = []
    stored = InMemoryImages(images) if keep_images else None  # one for the split: every record reads its row
    records: list[ImageRecord] = []
    broken = 0
    held = 0  # image bytes kept
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
                raise DatasetError(f"{sample_name(sample)}: the {split} split holds more than data.max_split_samples ({limits.split_samples:,}) samples; refused")
            if held > limits.split_bytes:
                raise DatasetError(f"{sample_name(sample)}: the {split} split takes more than data.max_split_bytes ({size_text(limits.split_bytes)}) in memory; refused")
        records.append(ImageRecord(sample_image_id(sample, len(records)), Path(split) / sample["__key__"], tuple(captions),
                                   stored=stored, row=len(images) if keep_images else 0))
        if keep_images:
            images.append(image)
    if broken:
        log.warning("%s: %d of %d samples have no image or caption; left out", shards.pattern, broken, broken + len(records))
    if not records:
        raise DatasetError(f"{shards.pattern}: no sample with an image and a caption")
    return records


def sample_image_id(sample: dict, position: int) -> int:
    """The sample's image id: its JSON's "image_id" when there is one, else its position."""
    try:
        found = json.loads(sample["json"]).get("image_id") if "json" in sample else None
    except (ValueError, UnicodeDecodeError, AttributeError):
        found = None
    return found if is_int(found) else position


@dataclass(eq=False)
class InMemoryImages:
    """A split's image bytes, read by row (records.StoredImages)."""

    images: list[bytes]

    def read(self, row: int) -> bytes:
        return self.images[row]


@dataclass
class WorkerPosition:
    """How far one worker's stream has gone in the epoch."""

    batches: int = 0  # batches yielded (and trained, when recorded by ShardStream)
    drawn: int = 0  # samples drawn from the shuffle buffer
    broken: int = 0  # of those, skipped as broken


@dataclass
class StreamBatch:
    """A batch with where its worker stood after it, so the main process can record it."""

    batch: CaptionBatch
    worker: int
    position: WorkerPosition
    keys: list[str]

    def pin_memory(self) -> StreamBatch:
        return StreamBatch(self.batch.pin_memory(), self.worker, self.position, self.keys)


@dataclass
class StreamFailure:
    """A worker's fatal problem, sent as an item so the main process raises it in one line."""

    message: str


@dataclass
class StreamSettings:
    """What the workers need besides the shards: the plan's inputs and how to make an item."""

    seed: int
    rank: int
    world: int
    workers: int  # DataLoader workers per rank (0 counts as 1: the main process reads)
    batch_size: int
    max_broken: float
    buffer: int
    max_length: int
    pairs: str  # "one" caption per image, drawn, or "all"


class StreamingCaptions(IterableDataset):
    """One rank's batches of an epoch of the shards (run in its DataLoader workers)."""

    def __init__(self, shards: ShardSet, vocab: Vocabulary, transform: ImageTransform, settings: StreamSettings) -> None:
        self.shards = shards
        self.vocab = vocab
        self.transform = transform
        self.settings = settings
        self.epoch = 1
        self.start = [WorkerPosition() for _ in range(max(1, settings.workers))]
        self._plan: tuple[int, EpochPlan] | None = None

    def plan(self, epoch: int) -> EpochPlan:
        """The epoch's plan, made once per epoch: the training loop asks for its length every step."""
        if self._plan is None or self._plan[0] != epoch:
            s = self.settings
            self._plan = epoch, plan_epoch(self.shards.counts, s.seed, epoch, s.world, max(1, s.workers), s.batch_size, s.max_broken)
        return self._plan[1]

    def __iter__(self) -> Iterator[StreamBatch | StreamFailure]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        s = self.settings
        plan = self.plan(self.epoch)
        planned, allowed = plan.batches[s.rank][worker], plan.reserve[s.rank][worker]
        position = WorkerPosition(**vars(self.start[worker]))
        if position.batches >= planned:
            return
        urls = [self.shards.urls[i] for i in plan.shards[s.rank][worker]]
        rng = random.Random(epoch_seed(s.seed, self.epoch, s.rank, worker))
        stream = shuffled(read_samples(urls, self.shards.limits), s.buffer, rng)
        try:
            for _ in range(position.drawn):  # a resumed epoch: replay the stream up to where it stood, decoding nothing
                next(stream)
            items, keys = [], []
            for sample in stream:
                position.drawn += 1
                try:
                    draw = epoch_seed(s.seed, self.epoch, s.rank, worker, position.drawn) % DRAW_LIMIT
                    items.append(self.item(sample, draw, position.drawn))
                    keys.append(str(sample["__key__"]))
                except BrokenSample as e:
                    position.broken += 1
                    log.warning("skipping a broken sample: %s: %s", sample_name(sample), e)
                    if position.broken > allowed:
                        yield StreamFailure(
                            f"{sample_name(sample)}: {position.broken} broken samples in {position.drawn} read by rank {s.rank}'s worker {worker}, "
                            f"more than data.max_broken_fraction ({s.max_broken:g}) allows; fix the shards or raise the limit"
                        )
                        return
                    continue
                if len(items) == s.batch_size:
                    position.batches += 1
                    yield StreamBatch(collate_captions(items), worker, WorkerPosition(**vars(position)), keys)
                    items, keys = [], []
                    if position.batches == planned:
                        return
        except (DatasetError, StopIteration) as e:
            yield StreamFailure(str(e) or f"{self.shards.pattern}: the shards ended before their counted samples")
            return
        yield StreamFailure(
            f"{', '.join(urls[:3])}{' ...' if len(urls) > 3 else ''}: rank {s.rank}'s worker {worker} read {position.drawn} samples, "
            f"fewer than the index counts; the shards or their shards.json changed"
        )

    def item(self, sample: dict, draw: int, index: int) -> tuple[torch.Tensor, list[list[int]], int]:
        """(image (3, S, S) uint8, token lists, `index`: the sample's place in its worker's
        stream) for collate_captions; BrokenSample otherwise. `draw` picks the caption and seeds
        the augmentation, so both replay after a resume."""
        captions = sample_captions(sample)
        data = sample_image(sample)
        tokens = [self.vocab.encode(c, self.settings.max_length) for c in captions]
        if self.settings.pairs != "all":
            tokens = [tokens[draw % len(tokens)]]
        try:
            picture = load_image(data, name=sample_name(sample))
            if self.transform.train and self.transform.augment:
                with torch.random.fork_rng(devices=[]):  # seeded augmentation: the same after a resume
                    torch.manual_seed(draw)
                    image = self.transform(picture)  # (3, S, S) uint8
            else:
                image = self.transform(picture)  # (3, S, S) uint8
        except ImageLoadError as e:
            raise BrokenSample(str(e)) from None
        return image, tokens, index


@dataclass
class ShardStream:
    """The training loader over the shards for one rank: the epoch's batches through a DataLoader,
    with what `EpochBatchSampler` offers the training loop (`set_epoch`, its length) and the
    workers' positions for last.pt (`positions`, `resume`)."""

    dataset: StreamingCaptions
    pin_memory: bool = False
    worker_init_fn: Callable[[int], None] | None = None
    taken: list[WorkerPosition] = field(default_factory=list)
    trace: Path | None = None  # a file that gets the key of every sample trained (CAPTIONER_TRACE_SAMPLES)

    def __post_init__(self) -> None:
        self.taken = [WorkerPosition() for _ in self.dataset.start]

    @property
    def global_batch(self) -> int:
        return self.dataset.settings.batch_size * self.dataset.settings.world

    def __len__(self) -> int:
        return self.dataset.plan(self.dataset.epoch).steps

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Epoch `epoch` from its batch `start`: 0, or where `resume` put the workers."""
        self.dataset.epoch = epoch
        if start == 0:
            self.taken = [WorkerPosition() for _ in self.taken]
        elif sum(p.batches for p in self.taken) != start:
            raise DatasetError(f"the stream was asked to start at batch {start}, but its workers' positions add up to {sum(p.batches for p in self.taken)}")
        self.dataset.start = [WorkerPosition(**vars(p)) for p in self.taken]
        if len(self) == 0:
            s = self.dataset.settings
            raise DatasetError(
                f"{self.dataset.shards.pattern}: {self.dataset.shards.samples} samples in {len(self.dataset.shards.urls)} shards "
                f"give no full batch of {s.batch_size} to each of {s.world} rank(s) x {max(1, s.workers)} worker(s); use fewer workers or a smaller batch"
            )

    def positions(self) -> list[list[int]]:
        """Each worker's position after the batches trained so far (plain data, for last.pt)."""
        return [[p.batches, p.drawn, p.broken] for p in self.taken]

    def resume(self, saved: list[list[int]], where: str) -> None:
        if len(saved) != len(self.taken):
            raise DatasetError(f"{where}: saved with {len(saved)} loader worker(s) per rank mid-epoch; resume it with data.num_workers={len(saved)}")
        self.taken = [WorkerPosition(*p) for p in saved]

    def __iter__(self) -> Iterator[CaptionBatch]:
        workers = self.dataset.settings.workers
        loader = DataLoader(self.dataset, batch_size=None, num_workers=workers, pin_memory=self.pin_memory,
                            worker_init_fn=self.worker_init_fn if workers else None, persistent_workers=False)
        trace = open(self.trace, "a") if self.trace is not None else None
        try:
            for item in loader:
                if isinstance(item, StreamFailure):
                    raise DatasetError(item.message)
                self.taken[item.worker] = item.position
                if trace is not None:
                    trace.write("".join(f"{self.dataset.epoch} {key}\n" for key in item.keys))
                    trace.flush()
                yield item.batch
        finally:
            if trace is not None:
                trace.close()
            broken = sum(p.broken for p in self.taken)
            if broken:
                log.warning("%d broken samples skipped in epoch %d so far (rank %d)", broken, self.dataset.epoch, self.dataset.settings.rank)
