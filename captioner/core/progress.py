"""Progress bars on a terminal and none in a log file: one rule for every long loop."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tqdm import tqdm


def progress_bar(iterable: Iterable[Any] | None = None, *, enabled: bool = True, **options: Any) -> tqdm:
    """A tqdm bar where its stream (stderr unless `file=` says otherwise) is a terminal. Written
    to a pipe or a log file a bar is thousands of carriage-return frames, so there it is off
    (tqdm's `disable=None`) and the caller's own lines (one per epoch, the result) carry the
    progress. `enabled=False` turns it off everywhere (another rank, a `--quiet` flag)."""
    return tqdm(iterable, disable=None if enabled else True, **options)
