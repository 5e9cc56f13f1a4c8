"""WebDataset shards streamed to training: each rank's workers read the shards a (seed, epoch) plan deals them.
A resumed worker replays its stream undecoded to its position; docs/training.md says what an epoch is."""

from __future__ import annotations

import contextlib
import logging
import math
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from captioner.core.errors import DatasetError, ImageLoadError
from captioner.core.progress import EVERY_RANK
from captioner.data.batching import DRAW_LIMIT, CaptionBatch, collate_captions, epoch_seed
from captioner.data.image_files import load_image
from captioner.data.image_transform import ImageTransform
from captioner.data.shards import BrokenSample, ShardSet, read_samples, sample_captions, sample_image, sample_name
from captioner.text.vocab import Vocabulary

log = logging.getLogger(__name__)


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
    """Permuted shards dealt to ranks then workers; each worker keeps ceil(max_broken x n) of its n samples
    for broken ones, and the largest give up batches until every rank takes the same steps."""
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


def shuffled(samples: Iterable[dict], size: int, rng: random.Random) -> Iterator[dict]:
    """A shuffle buffer of `size` samples (webdataset's kind)."""
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

    def __init__(self, shards: ShardSet, vocab: Vocabulary, transform: ImageTransform,
                 settings: StreamSettings) -> None:
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
            self._plan = epoch, plan_epoch(self.shards.counts, s.seed, epoch, s.world, max(1, s.workers),
                                           s.batch_size, s.max_broken)
        return self._plan[1]

    def __iter__(self) -> Iterator[StreamBatch | DatasetError]:
        """The worker's batches; a fatal problem is sent as a last item, so the main process raises it in one line."""
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
            for _ in range(position.drawn):  # a resumed epoch: replay the stream to where it stood, undecoded
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
                        yield DatasetError(f"{sample_name(sample)}: {position.broken} broken samples in "
                                            f"{position.drawn} read by rank {s.rank}'s worker {worker}, more than "
                                            f"data.max_broken_fraction ({s.max_broken:g}) allows; fix the shards or "
                                            "raise the limit")
                        return
                    continue
                if len(items) == s.batch_size:
                    position.batches += 1
                    yield StreamBatch(collate_captions(items), worker, WorkerPosition(**vars(position)), keys)
                    items, keys = [], []
                    if position.batches == planned:
                        return
        except (DatasetError, StopIteration) as e:
            yield DatasetError(str(e) or f"{self.shards.pattern}: the shards ended before their counted samples")
            return
        yield DatasetError(f"{', '.join(urls[:3])}{' ...' if len(urls) > 3 else ''}: rank {s.rank}'s worker {worker} "
                            f"read {position.drawn} samples, fewer than the index counts; the shards or their "
                            "shards.json changed")

    def item(self, sample: dict, draw: int, index: int) -> tuple[torch.Tensor, list[list[int]], int]:
        """(image (3, S, S) uint8, token lists, `index`) for collate_captions, else BrokenSample; `draw` picks
        the caption and seeds the augmentation, so both replay after a resume."""
        tokens = [self.vocab.encode(c, self.settings.max_length) for c in sample_captions(sample)]
        if self.settings.pairs != "all":
            tokens = [tokens[draw % len(tokens)]]
        seed = draw if self.transform.train and self.transform.augment else None  # the same after a resume
        try:
            image = self.transform(load_image(sample_image(sample), name=sample_name(sample)), seed)  # (3, S, S) uint8
        except ImageLoadError as e:
            raise BrokenSample(str(e)) from None
        return image, tokens, index


@dataclass
class ShardStream:
    """One rank's training loader over the shards, with `EpochBatchSampler`'s `set_epoch` and length, and the
    workers' positions for last.pt (`positions`, `resume`)."""

    dataset: StreamingCaptions
    pin_memory: bool = False
    worker_init_fn: Callable[[int], None] | None = None
    taken: list[WorkerPosition] = field(default_factory=list)
    trace: Path | None = None  # a file that gets every trained sample's key (CAPTIONER_TRACE_SAMPLES)

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
            raise DatasetError(f"the stream was asked to start at batch {start}, "
                               f"but its workers' positions add up to {sum(p.batches for p in self.taken)}")
        self.dataset.start = [WorkerPosition(**vars(p)) for p in self.taken]
        if len(self) == 0:
            s = self.dataset.settings
            raise DatasetError(f"{self.dataset.shards.pattern}: {self.dataset.shards.samples} samples in "
                               f"{len(self.dataset.shards.urls)} shards give no full batch of {s.batch_size} to each "
                               f"of {s.world} rank(s) x {max(1, s.workers)} worker(s); use fewer workers or a "
                               "smaller batch")

    def positions(self) -> list[list[int]]:
        """Each worker's position after the batches trained so far (plain data, for last.pt)."""
        return [[p.batches, p.drawn, p.broken] for p in self.taken]

    def resume(self, saved: list[list[int]], where: str) -> None:
        if len(saved) != len(self.taken):
            raise DatasetError(f"{where}: saved with {len(saved)} loader worker(s) per rank mid-epoch; "
                               f"resume it with data.num_workers={len(saved)}")
        self.taken = [WorkerPosition(*p) for p in saved]

    def __iter__(self) -> Iterator[CaptionBatch]:
        workers = self.dataset.settings.workers
        loader = DataLoader(self.dataset, batch_size=None, num_workers=workers, pin_memory=self.pin_memory,
                            worker_init_fn=self.worker_init_fn if workers else None, persistent_workers=False)
        try:
            with open(self.trace, "a") if self.trace is not None else contextlib.nullcontext() as trace:
                for item in loader:
                    if isinstance(item, DatasetError):
                        raise item
                    self.taken[item.worker] = item.position
                    if trace is not None:
                        trace.write("".join(f"{self.dataset.epoch} {key}\n" for key in item.keys))
                        trace.flush()
                    yield item.batch
        finally:
            if broken := sum(p.broken for p in self.taken):
                log.warning("%d broken samples skipped in epoch %d so far (rank %d)", broken, self.dataset.epoch,
                            self.dataset.settings.rank, extra=EVERY_RANK)
