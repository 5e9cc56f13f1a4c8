"""What captioner computes once per machine, kept between processes in its cache folder
($CAPTIONER_CACHE_DIR, else $XDG_CACHE_HOME/captioner, else ~/.cache/captioner); among it a JSON file of
what was measured on the local machine, keyed by processor, core count, torch version and the kernels the
environment holds torch to (a file that cannot be read or written is measured anew).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import platform
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from captioner.core.errors import StorageError
from captioner.core.files import write_atomically

try:
    import fcntl
except ImportError:  # not POSIX: no lock, each process builds or measures for itself
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

FILE_NAME = "machine.json"
# Variables that hold torch's kernels to an instruction set or to another arithmetic: each changes both what a
# speed decision measures and the last bits of what is computed.
KERNEL_SETTINGS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_DEFAULT_FPMATH_MODE",
                   "DNNL_DEFAULT_FPMATH_MODE", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")


def cache_dir() -> Path:
    if os.environ.get("CAPTIONER_CACHE_DIR"):
        return Path(os.environ["CAPTIONER_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "captioner"


@contextlib.contextmanager
def exclusive(name: str, folder: Path | None = None) -> Iterator[None]:
    """Hold the lock `<name>.lock` of `folder` (the cache folder): what one process builds, the others wait for."""
    folder = folder or cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "w") as lock:
        _flock(lock)
        yield


def _flock(handle: IO[str], waiting: Callable[[], None] | None = None) -> None:
    """`handle`'s exclusive flock, waiting while another process holds it (`waiting()`, if given, says so first); a
    file system without locks (ENOLCK: some network ones) leaves it unheld, as a system without fcntl does."""
    if fcntl is None:
        return
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        if waiting is not None:
            waiting()
        fcntl.flock(handle, fcntl.LOCK_EX)
    except OSError:
        pass


LOCKS = "locks"  # the cache's folder of the locks that stand for a folder of the user's (a run's, a shapes world's)


def folder_lock_file(kind: str, folder: Path) -> Path:
    """The lock file in the cache that stands for the existing `folder` in `kind`'s work, named by the folder's device
    and inode: the folder's own files stay untouched, and one folder under any of its names has one lock. Its
    folder is made where it can be (where it cannot, opening the lock fails, and the caller goes on unheld)."""
    place = folder.stat()
    locks = cache_dir() / LOCKS
    with contextlib.suppress(OSError):
        locks.mkdir(parents=True, exist_ok=True)
    return locks / f"{kind}-{place.st_dev}-{place.st_ino}.lock"


@contextlib.contextmanager
def folder_held(kind: str, folder: Path, doing: str, says: logging.Logger) -> Iterator[None]:
    """Hold `folder`'s lock for `kind` (`folder_lock_file`), waiting while another process holds it: `says` tells the
    user first, "waiting for another process, which is `doing`". Where the cache cannot be written or takes no
    locks, nothing is held."""
    waiting = functools.partial(says.info, "waiting for another process, which is %s", doing)
    try:
        handle = open(folder_lock_file(kind, folder), "w")
    except OSError:
        handle = None
    with handle or contextlib.nullcontext():
        if handle is not None:
            _flock(handle, waiting)
        yield


def processor_name() -> str:
    """The processor's model name with family and model numbers (a VM's name may hide the generation)."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "cpu family", "model"):
                fields.setdefault(key.strip(), value.strip())
            if not line.strip() and fields:  # the first processor's block is enough
                break
    if "model name" in fields:
        return f"{fields['model name']} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"
    return platform.processor() or platform.machine() or "unknown"


def machine_key() -> str:
    """The processor, its core count, the torch version and any of KERNEL_SETTINGS set: what a speed decision
    and a computation's last bits depend on. Without those variables, the key is the first three alone."""
    import torch  # here: METEOR's index shares the cache folder without torch

    key = f"{processor_name()} | {os.cpu_count()} cores | torch {torch.__version__}"
    return f"{key} | {held}" if (held := kernel_settings()) else key


def held_kernels() -> dict[str, str]:
    """The KERNEL_SETTINGS the environment sets, name -> value, in KERNEL_SETTINGS' order."""
    values = {name: os.environ.get(name, "").strip() for name in KERNEL_SETTINGS}
    return {name: value for name, value in values.items() if value}


def kernel_settings() -> str:
    """The KERNEL_SETTINGS the environment sets, as NAME=value, comma-separated; '' where none is."""
    return ", ".join(f"{name}={value}" for name, value in held_kernels().items())


def _read() -> dict[str, Any]:
    try:
        data = json.loads((cache_dir() / FILE_NAME).read_text())
    except (OSError, ValueError, RecursionError):  # unreadable, damaged, nested past Python's limit: measured anew
        return {}
    return data if isinstance(data, dict) else {}


def recall(name: str) -> Any:
    """The decision `name` measured on the local machine, or None."""
    entry = _read().get(machine_key())
    return entry.get(name) if isinstance(entry, dict) else None


def remember(name: str, value: Any) -> None:
    """Keep a decision for the local machine (atomically); a file that cannot be written is left as it was."""
    data = _read()
    entry = data.get(machine_key())
    data[machine_key()] = {**(entry if isinstance(entry, dict) else {}), name: value}
    path = cache_dir() / FILE_NAME
    try:
        write_atomically(path, lambda tmp: tmp.write_text(json.dumps(data, indent=1)))
    except StorageError as e:
        log.debug("machine cache: could not write %s (%s)", path, e)


def decided(name: str, measure: Callable[[], Any], valid: Callable[[Any], bool]) -> tuple[Any, bool]:
    """The decision `name` on the local machine, and whether this process measured it. One process
    measures while the others wait on a lock, so torchrun's ranks take one decision, not both sides of
    a close call; where the folder cannot be written, each measures alone."""
    known = recall(name)
    if valid(known):
        return known, False
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(exclusive(FILE_NAME))
        except OSError:
            return measure(), True
        known = recall(name)  # measured while this process waited
        if valid(known):
            return known, False
        value = measure()
        remember(name, value)
        return value, True
