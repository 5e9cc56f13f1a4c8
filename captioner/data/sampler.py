"""The training order: one shuffle per epoch from (seed, epoch), sharded over ranks, resumable from any batch.
Rank r takes every world_size-th position from r (as DistributedSampler); items are (index, draw)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

DRAW_LIMIT = 2**62  # draws are non-negative int64 seeds


def epoch_seed(seed: int, epoch: int, *more: int) -> int:
    """A 64-bit seed hashed from (seed, epoch, *more) by numpy's SeedSequence; `more`: a rank, a worker, a sample."""
    return int(np.random.SeedSequence([seed, epoch, *more]).generate_state(1, dtype=np.uint64)[0])


class EpochBatchSampler(Sampler[list[tuple[int, int]]]):
    """Batches of (index, draw) for one rank; `set_epoch(epoch, start)` picks the order and the first batch."""

    def __init__(self, size: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> None:
        if size <= 0:
            raise ValueError("the dataset is empty")
        self.size = size
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 1
        self.start = 0

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def __len__(self) -> int:
        """Batches per epoch: full global batches only, or one batch of everything for a smaller dataset."""
        return max(1, self.size // self.global_batch)

    @property
    def span(self) -> int:
        """Positions per global batch: the global batch, or a smaller dataset rounded up to equal shares."""
        if self.size >= self.global_batch:
            return self.global_batch
        return -(-self.size // self.world_size) * self.world_size

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        if not 0 <= start <= len(self):
            raise ValueError(f"start batch {start} is outside the epoch's {len(self)} batches")
        self.epoch, self.start = epoch, start

    def order(self, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The epoch's permutation and draws, both (len(self) * span,)."""
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        permutation = torch.randperm(self.size, generator=generator)  # (size,)
        draws = torch.randint(DRAW_LIMIT, (self.size,), generator=generator)  # (size,)
        needed = len(self) * self.span
        if needed > self.size:  # a small dataset shared by several ranks: wrap around to equal shares
            repeats = -(-needed // self.size)
            permutation, draws = permutation.repeat(repeats), draws.repeat(repeats)  # (repeats * size,)
        return permutation[:needed], draws[:needed]  # (needed,) each

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        permutation, draws = (t.tolist() for t in self.order(self.epoch))
        span = self.span
        for k in range(self.start, len(self)):
            positions = range(k * span + self.rank, (k + 1) * span, self.world_size)
            yield [(permutation[p], draws[p]) for p in positions]
