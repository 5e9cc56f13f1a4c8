"""Files written so that a failure loses nothing (beside their name, then renamed onto it), and checked
before anything reads them: a failed write (a full disk above all) is one `StorageError` naming the file
and the space left; a missing, truncated or altered file is one `ExportError`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from captioner.core.errors import ExportError, StorageError

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
    try:
        write_atomically(path, lambda link: os.link(source, link))
    except StorageError:  # no hard links on this file system (or a temporary file left behind): a copy
        write_atomically(path, lambda copy: shutil.copyfile(source, copy))


def check_writable_folder(folder: str | Path) -> None:
    """Refuse, in one line, a `folder` that cannot be made or written into (a file where a folder of its path
    goes, no permission), so that it is said before a command's work starts, not after."""
    folder = Path(folder)
    nearest = next(p for p in (folder, *folder.parents) if os.path.lexists(p) or p == p.parent)
    if nearest == folder and not folder.is_dir():
        raise StorageError(f"{folder}: exists and is not a folder")
    if not nearest.is_dir():
        raise StorageError(f"{folder}: cannot create the folder ({os.strerror(errno.ENOTDIR)})")
    if not os.access(nearest, os.W_OK | os.X_OK):
        verb = "write into" if nearest == folder else "create"
        raise StorageError(f"{folder}: cannot {verb} the folder ({os.strerror(errno.EACCES)})")


def sha256_of(path: str | Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks (a model file never sits in memory twice)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


REEXPORT = "re-export the checkpoint"


def verify_file(path: Path, sha256: str, listed_in: Path, size: int | None = None, remedy: str = REEXPORT) -> None:
    """A missing, truncated or altered file `listed_in` records is one ExportError ending with `remedy`."""
    if not path.is_file():
        raise ExportError(f"{path}: missing (listed in {listed_in.name}); {remedy}")
    found = path.stat().st_size
    if size is not None and found != size:
        raise ExportError(f"{path}: {found} bytes, but {listed_in.name} records {size} (truncated or replaced); "
                          f"{remedy}")
    if sha256_of(path) != sha256:
        raise ExportError(f"{path}: sha256 does not match {listed_in.name} (checksum differs: the file was changed or "
                          f"damaged); {remedy}")
