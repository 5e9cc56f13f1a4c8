"""Progress bars on a terminal and none in a log file: one rule for every long loop."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tqdm import tqdm


def progress_bar(iterable: Iterable[Any] | None = None, *, enabled: bool = True, **options: Any) -> tqdm:
    """A tqdm bar on a terminal, off in a pipe or log file; `enabled=False`: off everywhere (`--quiet`)."""
    return tqdm(iterable, disable=None if enabled else True, **options)
