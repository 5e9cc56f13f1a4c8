"""Where captioner keeps what it computes once per machine.

$CAPTIONER_CACHE_DIR, else $XDG_CACHE_HOME/captioner, else ~/.cache/captioner.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no lock, each process builds or measures for itself
    fcntl = None  # type: ignore[assignment]


def cache_dir() -> Path:
    if os.environ.get("CAPTIONER_CACHE_DIR"):
        return Path(os.environ["CAPTIONER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "captioner"


@contextmanager
def exclusive(name: str) -> Iterator[None]:
    """Hold the cache folder's lock `<name>.lock`: what one process builds, the others wait for."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield
