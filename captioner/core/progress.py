"""Progress bars on a terminal and none in a log file: one rule for every long loop."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tqdm import tqdm


def progress_bar(iterable: Iterable[Any] | None = None, *, enabled: bool = True, **options: Any) -> tqdm:
    """A tqdm bar where its stream is a terminal, off in a pipe or log file (tqdm's `disable=None`);
    `enabled=False` turns it off everywhere (another rank, `--quiet`)."""
    return tqdm(iterable, disable=None if enabled else True, **options)
