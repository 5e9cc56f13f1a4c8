"""glibc malloc's settings for a process of large tensors, applied when the command line starts.

By default glibc maps every block over its threshold (at most 32 MB) afresh and unmaps it when freed, so each
step of a convolution network or a training loop makes its large activations anew and the kernel zero-fills
their pages again (tens of thousands of page faults a step). `keep_large_blocks` raises both thresholds: freed
blocks stay in the heap and the next step reuses them. Where the user set glibc's own variables, theirs hold;
`CAPTIONER_MALLOC=glibc` leaves glibc's defaults.
"""

from __future__ import annotations

import ctypes
import functools
import os

from captioner.core.errors import ConfigError

M_TRIM_THRESHOLD = -1  # glibc's malloc.h names
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 256 << 20  # blocks below it come from the heap and are reused: a step's activations
TRIM_THRESHOLD = 512 << 20  # free memory the heap's top may keep before it is handed back
ENV = "CAPTIONER_MALLOC"  # "glibc": glibc's defaults kept
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
CHOOSING = (ENV, "GLIBC_TUNABLES", *USER_SETTINGS)  # every variable `user_tuned` reads


@functools.cache
def _mallopt() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """glibc's mallopt, or None (another C library, or none found). Looked up among the symbols the
    process has loaded: `ctypes.util.find_library` would run `ldconfig -p`, and a command starts no process."""
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # TypeError: a platform whose CDLL needs a name
        return None


def user_tuned() -> bool:
    """Whether the environment chooses glibc's malloc thresholds: its variables, GLIBC_TUNABLES, CAPTIONER_MALLOC."""
    if choice := os.environ.get(ENV, "").strip():
        if choice != "glibc":
            raise ConfigError(f"{ENV}={choice!r}: expected 'glibc' (glibc's own malloc thresholds) or nothing")
        return True
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return any(name in os.environ for name in USER_SETTINGS) or any(
        f"glibc.malloc.{name}" in tunables for name in ("mmap_threshold", "trim_threshold", "top_pad")
    )


def keep_large_blocks(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Keep freed blocks below `mmap_threshold` bytes for reuse (the heap's top trimmed past `trim_threshold`);
    False where it is not glibc or the environment chooses (`user_tuned`). Where tensors live changes, not
    what is computed: a run's numbers are the same."""
    mallopt = _mallopt()
    if mallopt is None or user_tuned():
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))


def limit_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas (MALLOC_ARENA_MAX): one per thread keeps freed pages; False without glibc."""
    mallopt = _mallopt()
    return mallopt is not None and bool(mallopt(M_ARENA_MAX, arenas))
