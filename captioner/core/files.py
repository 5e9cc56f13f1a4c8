"""Writing a file so that a failure loses nothing: beside its name, then renamed onto it.

A failed write (a full disk above all) is one `StorageError` naming the file and the space left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from captioner.core.errors import StorageError

T = TypeVar("T")


def size_text(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1000:
            return f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return f"{nbytes:.1f} TB"


def free_space(directory: Path) -> str:
    """The space left for files in `directory` (or the nearest folder that exists), as text."""
    for folder in (directory, *directory.parents):
        with contextlib.suppress(OSError):
            return f"{size_text(shutil.disk_usage(folder).free)} free on {folder}"
    return "free space unknown"


def write_failure(path: Path, error: OSError, kept: str = "") -> StorageError:
    """One line: the file, why the system refused it, the space left, and what is kept."""
    reason = error.strerror or str(error) or type(error).__name__
    return StorageError(f"{path}: cannot write it ({reason}); {free_space(path.parent)}{kept}")


def write_atomically(path: str | Path, write: Callable[[Path], T]) -> T:
    """`write(tmp)` beside `path`, flushed, renamed onto it; on an OSError the previous `path` stays."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        result = write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())  # on the disk before the rename makes it the file
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        kept = f"; the previous {path.name} is kept" if path.exists() else ""
        raise write_failure(path, e, kept) from None
    return result


def same_file_as(source: Path, path: Path) -> None:
    """Make `path` a hard link to `source`, else an atomic copy (files are replaced whole, never edited)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.unlink(missing_ok=True)
        os.link(source, tmp)
        os.replace(tmp, path)
        return
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    write_atomically(path, lambda copy: shutil.copyfile(source, copy))
