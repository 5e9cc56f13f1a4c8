"""Process-wide runtime settings, applied once when the command line starts.

Threads: on a small shared machine, torch threads beyond the cores that are really free only
add contention (each thread spins at synchronisation points while another process holds its
core; docs/benchmarks.md has the measurements), so one knob sets them: `train.threads` in a
training config, else the environment variable CAPTIONER_THREADS, else, under torchrun, its
OMP_NUM_THREADS (it splits the node's cores between the ranks), else the cores that are free
when the command starts (the cores minus the other runnable processes, at least 1).

DataLoader workers: `data.num_workers: -1` (auto) gives each rank its share of the node's cores
less one for the rank's own process, so 8 ranks on 16 cores run 8 workers, not 64.
"""

from __future__ import annotations

import os
import random
import statistics
import time

import numpy as np
import torch

from captioner.core.errors import ConfigError

ENV_THREADS = "CAPTIONER_THREADS"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def other_runnable_processes(samples: int = 5, interval: float = 0.01) -> int | None:
    """Processes running or waiting for a core right now, besides this one (median of a few
    reads of /proc/loadavg's running count); None where the kernel does not say."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
        except (OSError, IndexError, ValueError):
            return None
        if i + 1 < samples:
            time.sleep(interval)
    return max(0, int(statistics.median(counts)))


def free_cores() -> int:
    """The cores nobody else is using now: all of them when the machine is idle, 1 when busy."""
    cores = usable_cores()
    others = other_runnable_processes()
    return cores if others is None else max(1, min(cores, cores - others))


def positive_env(name: str) -> int | None:
    """The environment variable `name` as a positive integer; None when unset or empty."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{name}={text!r}: expected a positive integer")
    return value


def local_world_size() -> int:
    """Processes of this run on this node: torchrun's LOCAL_WORLD_SIZE, else 1."""
    return positive_env("LOCAL_WORLD_SIZE") or 1


def resolve_threads(requested: int | None = None) -> int:
    """`requested` (> 0) wins; else $CAPTIONER_THREADS; else, under torchrun (LOCAL_WORLD_SIZE
    set), its $OMP_NUM_THREADS or this rank's share of the cores; else the free cores."""
    if requested:
        return requested
    threads = positive_env(ENV_THREADS)
    if threads:
        return threads
    if positive_env("LOCAL_WORLD_SIZE"):
        return positive_env("OMP_NUM_THREADS") or max(1, usable_cores() // local_world_size())
    return free_cores()


def set_threads(requested: int | None = None) -> int:
    """Set torch's intra-op threads as `resolve_threads` says; returns the number set."""
    threads = resolve_threads(requested)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


AUTO_WORKERS = -1  # data.num_workers: one rank's share of the node's cores


def loader_workers(requested: int) -> int:
    """DataLoader workers for `data.num_workers`: as given when >= 0; for AUTO_WORKERS, this
    rank's share of the usable cores less one (the rank's own process decodes nothing but
    keeps the device fed), at least 1."""
    if requested != AUTO_WORKERS:
        return requested
    return max(1, usable_cores() // local_world_size() - 1)


def resolve_device(name: str | torch.device = "auto", what: str = "device") -> torch.device:
    """"auto" (a CUDA GPU when there is one, else the CPU), "cpu", "cuda" or "cuda:N"; a one-line
    error when CUDA is asked for and absent."""
    if isinstance(name, torch.device):
        name = str(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"{what}: {name!r} asked for, but no CUDA GPU is available (use auto or cpu)")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{what}: {name!r} is not a device (auto, cpu, cuda, cuda:N)") from None


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX tiles). There, oneDNN's
    bf16 convolutions and matrix products take about half the time of fp32 ones; elsewhere
    bf16 is emulated and slower than fp32."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's generators (every device's), from one seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
