"""Process-wide runtime settings, applied once when the command line starts.

Threads: on a small shared machine, every torch thread beyond the cores that are really free
only adds contention (two 2-thread processes on 2 cores run slower than two 1-thread ones),
so the default is modest and one knob sets it: `train.threads` in a training config, else the
environment variable CAPTIONER_THREADS, else DEFAULT_THREADS (docs/benchmarks.md has the
measurements behind it).
"""

from __future__ import annotations

import os

import torch

from captioner.errors import ConfigError

ENV_THREADS = "CAPTIONER_THREADS"
DEFAULT_THREADS = 1


def resolve_threads(requested: int | None = None) -> int:
    """`requested` (> 0) wins; else $CAPTIONER_THREADS; else DEFAULT_THREADS capped at the cores."""
    if requested:
        return requested
    text = os.environ.get(ENV_THREADS, "").strip()
    if text:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise ConfigError(f"{ENV_THREADS}={text!r}: expected a positive number of threads")
        return value
    return max(1, min(DEFAULT_THREADS, os.cpu_count() or 1))


def set_threads(requested: int | None = None) -> int:
    """Set torch's intra-op threads as `resolve_threads` says; returns the number set."""
    threads = resolve_threads(requested)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
