"""Progress bars on a terminal and none in a log file: one rule for every long loop."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tqdm import tqdm


# A log record's `extra` where each torchrun rank says its own (its share's count): every other record of a run is
# said by rank 0 alone, the other ranks' copies dropped (apps/cli.py)
EVERY_RANK = {"every_rank": True}


def progress_bar(iterable: Iterable[Any] | None = None, *, enabled: bool = True, **options: Any) -> tqdm:
    """A tqdm bar on a terminal, off in a pipe or log file; `enabled=False`: off everywhere (`--quiet`)."""
    return tqdm(iterable, disable=None if enabled else True, **options)
