"""Process-wide settings, applied once when the command line starts: threads, workers, device, seeding.

The default is the free cores (more only add contention); a training run takes every usable core, since
its sums depend on the count.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from captioner.core.config_sections import MAX_THREADS
from captioner.core.errors import ConfigError

ENV_THREADS = "CAPTIONER_THREADS"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def other_runnable_processes(samples: int = 5, interval: float = 0.01) -> int | None:
    """Threads of other processes running or waiting for a core now (median of a few /proc/loadavg
    reads, less this process's running threads); None where the kernel does not say."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - max(1, own_running_threads()))
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
    with contextlib.suppress(ValueError):
        if (value := int(text)) >= 1:
            return value
    raise ConfigError(f"{name}={text!r}: expected a positive integer")


def threads_env(name: str) -> int | None:
    """The environment variable `name` as a thread count: a positive integer within train.threads' bound (a typo's
    million threads is refused in one line naming the variable, as the key's would be); None when unset or empty."""
    threads = positive_env(name)
    if threads is not None and threads > MAX_THREADS:
        raise ConfigError(f"{name}={threads}: expected at most {MAX_THREADS} threads (as train.threads)")
    return threads


def env_threads() -> int | None:
    """$CAPTIONER_THREADS, bounded as train.threads is; None when unset or empty."""
    return threads_env(ENV_THREADS)


def local_world_size() -> int:
    """Processes of this run on this node: torchrun's LOCAL_WORLD_SIZE, else 1."""
    return positive_env("LOCAL_WORLD_SIZE") or 1


def resolve_threads(requested: int | None = None) -> int:
    """`requested` (> 0); else $CAPTIONER_THREADS; else under torchrun its $OMP_NUM_THREADS or this
    rank's share of the cores; else the free cores."""
    if threads_are_automatic(requested):
        return free_cores()
    return (requested or env_threads() or threads_env("OMP_NUM_THREADS")
            or max(1, usable_cores() // local_world_size()))


def run_threads(requested: int | None = None) -> int:
    """As `resolve_threads`, but every usable core rather than the free ones: those change with the
    load, and a run's weights with them."""
    return usable_cores() if threads_are_automatic(requested) else resolve_threads(requested)


def set_threads(requested: int | None = None) -> int:
    """Set torch's intra-op threads as `resolve_threads` says; returns the number set."""
    threads = resolve_threads(requested)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


THREADS_PAY = 1.4  # a server's request runs on every core only where they make it this much faster than one


def threads_that_pay(action: Callable[[], object], cores: int, gain: float = THREADS_PAY, rounds: int = 2,
                     clock: Callable[[], float] = time.perf_counter) -> tuple[int, dict[int, float]]:
    """The torch threads a server runs `action` (one request's work) with: `cores` where they make it at
    least `gain` times faster than 1 thread (best of `rounds`, alternating, after a warm-up with each), else 1,
    which leaves the other cores to the server's own work. -> (threads, best seconds by count); torch is left
    at the choice. A small model gains nothing from a second core and its parallel regions then only contend
    with the server's threads: `python -m benchmarks demo_load` measures it."""
    if cores <= 1:
        torch.set_num_threads(1)
        return 1, {}
    best = {1: float("inf"), cores: float("inf")}
    for round_ in range(rounds + 1):  # round 0 warms up: first calls allocate and pick their kernels
        for threads in (1, cores) if round_ % 2 == 0 else (cores, 1):
            torch.set_num_threads(threads)
            started = clock()
            action()
            if round_:
                best[threads] = min(best[threads], clock() - started)
    chosen = cores if best[1] >= gain * best[cores] else 1
    torch.set_num_threads(chosen)
    return chosen, best


def own_running_threads() -> int:
    """This process's running or runnable threads (/proc/self/task/*/stat state R); 0 if unknown."""
    running = 0
    for stat in Path("/proc/self/task").glob("*/stat"):  # no folder (not Linux): no match
        with contextlib.suppress(OSError, IndexError):  # a thread that ended meanwhile
            running += stat.read_text().rsplit(")", 1)[1].split()[0] == "R"
    return running


def threads_are_automatic(requested: int | None = None) -> bool:
    """Whether nothing (a config, $CAPTIONER_THREADS, torchrun) fixed the thread count."""
    return not (requested or env_threads() or positive_env("LOCAL_WORLD_SIZE"))


class ThreadGovernor:
    """Keeps torch's threads at the free cores during a run (`train.follow_free_cores`), counting them
    again every `every_s` seconds at a step boundary (`python -m benchmarks threads` measures why)."""

    def __init__(self, every_s: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 free: Callable[[], int] = free_cores) -> None:
        self.every_s, self.clock, self.free = every_s, clock, free
        self.next_check = clock() + every_s
        self.changes: list[tuple[int, int]] = []  # (from, to), for the log and the tests

    def adjust(self) -> int | None:
        """At a step boundary: the new thread count when it changed, else None."""
        now = self.clock()
        if now < self.next_check:
            return None
        self.next_check = now + self.every_s
        wanted, current = self.free(), torch.get_num_threads()
        if wanted == current:
            return None
        torch.set_num_threads(wanted)
        self.changes.append((current, wanted))
        return wanted


AUTO_WORKERS = -1  # data.num_workers: one rank's share of the node's cores


def loader_workers(requested: int) -> int:
    """`data.num_workers` as given, or for AUTO_WORKERS this rank's share of the cores less one (>= 1)."""
    return requested if requested != AUTO_WORKERS else max(1, usable_cores() // local_world_size() - 1)


DEVICES = "auto, cpu, mps, cuda or cuda:N"


def resolve_device(name: str | torch.device = "auto", what: str = "device") -> torch.device:
    """"auto" (a CUDA GPU if there is one, else the CPU), "cpu", "mps", "cuda" or "cuda:N"; one line for another
    name, or for a device not present here (torch would fail later, with a traceback, or run on the meta device)."""
    name = str(name)  # a torch.device too
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(r"cpu(:0)?|mps(:0)?|cuda(:\d+)?", name):
        raise ConfigError(f"{what}: {name!r} is not a device captioner runs on ({DEVICES})")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{what}: {name!r} asked for, but no CUDA GPU is available (use auto or cpu)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ConfigError(f"{what}: {name!r} asked for, but this machine has {count} CUDA GPU(s): "
                          f"cuda:0 to cuda:{count - 1}")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{what}: {name!r} asked for, but this machine has no Apple GPU (use auto or cpu)")
    return device


def cpu_has_native_bf16() -> bool:
    """Whether this CPU has bf16 in hardware (AVX-512 BF16, AMX); elsewhere it is emulated, slower than fp32."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's generators (every device's), from one seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
