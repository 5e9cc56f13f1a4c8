"""Files written so that a failure loses nothing (beside their name, then renamed onto it; a set of them in a
folder of their own, moved in once all are written), and checked before anything reads them: a failed write (a full
disk above all) is one `StorageError` naming the file and the space left; a missing, truncated or altered file is
one `ExportError`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import TypeVar

from captioner.core.errors import CaptionerError, ExportError, StorageError

try:
    import fcntl
except ImportError:  # not POSIX: no folder lock, and no clearing of what a killed export left
    fcntl = None  # type: ignore[assignment]

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


def make_folder(folder: str | Path, said: str, error: type[CaptionerError] = StorageError,
                purpose: str = "to write into") -> Path:
    """`folder`, made with its parents; one `error` line starting with `said` (how the user named it) when a file
    stands there, or where one of its parents goes, or the OS refuses: never an OSError's traceback."""
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise error(f"{said}: a file, not a folder {purpose}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise error(f"{said}: cannot create the folder ({e.strerror or e})") from None
    return path


def folder_problem(folder: str | Path) -> str | None:
    """Why `folder` cannot be made or written into, seen without making it: a file stands there or where one of
    its parents goes, or no permission; None otherwise."""
    folder = Path(folder)
    nearest = next(p for p in (folder, *folder.parents) if os.path.lexists(p) or p == p.parent)
    if nearest == folder and not folder.is_dir():
        return "a file, not a folder to write into"
    if not nearest.is_dir():
        return f"cannot create the folder ({os.strerror(errno.ENOTDIR)})"
    if not os.access(nearest, os.W_OK | os.X_OK):
        verb = "write into" if nearest == folder else "create"
        return f"cannot {verb} the folder ({os.strerror(errno.EACCES)})"
    return None


def check_writable_folder(folder: str | Path) -> None:
    """Refuse, in one line, a `folder` that cannot be made or written into (`folder_problem`), so that it is said
    before a command's work starts, not after."""
    problem = folder_problem(folder)
    if problem is not None:
        raise StorageError(f"{folder}: {problem}")


def check_writable_file(path: str | Path) -> None:
    """Refuse, in one line, a file `path` that cannot be written (a folder stands there, or its folder cannot be
    made or written into), before a command's work starts rather than after it."""
    if Path(path).is_dir():
        raise StorageError(f"{path}: a folder, not a file to write")
    check_writable_folder(Path(path).parent)


class HeldElsewhere(StorageError):
    """Another process holds a lock file: `pid`, its process id as the file names it (None where it does not)."""

    def __init__(self, path: Path, pid: int | None) -> None:
        super().__init__(f"{path}: held by {f'process {pid}' if pid else 'another process'}")
        self.pid = pid


def hold_lock_file(path: str | Path) -> int | None:
    """An open descriptor of the file `path` (made if missing) holding its POSIX write lock, this process's id
    written in it. The kernel frees the lock when the process ends, however it ends, and the processes it forks (data
    loader workers) never hold it. `HeldElsewhere` when another process holds it; None where the system or the file
    system has no such locks (the work then goes on unlocked)."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a place that cannot be written: the work's own first write says so
        return None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        held = e.errno in (errno.EACCES, errno.EAGAIN)
        pid = _pid_in(fd) if held else None
        os.close(fd)
        if held:
            raise HeldElsewhere(Path(path), pid) from None
        return None  # no locks here (ENOLCK on some network file systems)
    with contextlib.suppress(OSError):  # the id only names the holder to the process it refuses
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _pid_in(fd: int) -> int | None:
    """The process id a lock file holds, if it holds one."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(os.pread(fd, 32, 0).decode("ascii").strip())
        return pid if pid > 0 else None
    return None


STAGE_PREFIX, STAGE_SUFFIX = ".captioner-staged-", ".tmp"  # `staged_folder`'s folders, inside the one they fill
NEW, EARLIER = "new", "earlier-"  # tags before the suffix: the set written; the set it replaces, + the marker
BUSY = "another export is writing into this folder; wait for it to finish"


def is_stage(name: str) -> bool:
    """Whether `name` is a folder `staged_folder` fills or sets aside (one a killed process left behind, say): never
    the user's."""
    return name.startswith(STAGE_PREFIX) and name.endswith(STAGE_SUFFIX)


def _hidden(tag: str) -> dict[str, str]:
    """`tempfile.mkdtemp`'s prefix and suffix for a hidden folder tagged `tag` (after its random part)."""
    return {"prefix": STAGE_PREFIX, "suffix": f"-{tag}{STAGE_SUFFIX}"}


def _tag(name: str) -> str:
    """The tag of the hidden folder `name` ("" for an earlier version's, which had none); the random part mkdtemp
    gives holds no "-"."""
    return name[len(STAGE_PREFIX):-len(STAGE_SUFFIX)].partition("-")[2] if is_stage(name) else ""


def set_aside_holds(folder: Path, marker: str) -> bool:
    """Whether `folder` holds a set that an export killed while swapping in its own set marked `marker` had set
    aside, and that set holds `marker`: an earlier complete set, which the next `staged_folder` moves back."""
    return folder.is_dir() and any(_tag(p.name) == EARLIER + marker and os.path.lexists(p / marker)
                                   for p in folder.iterdir())


@contextlib.contextmanager
def staged_folder(folder: str | Path, replaces: Collection[str], marker: str) -> Iterator[Path]:
    """A new hidden folder inside `folder` (made, with its parents, when missing) to write a whole set of files into;
    once the block ends, its entries replace those of `folder` named in `replaces`, so nothing of an earlier set
    stays, `marker` (the entry saying a set is complete) going first and coming last. On any exception `folder` is
    left as it was. Renamed within `folder`, so on its file system even as a mount point or a link's target.
    The block holds `folder`'s lock (another export into it is refused), under which what a killed export left
    there is cleared first (`_recover`)."""
    folder = Path(folder)
    check_writable_folder(folder)
    made = [p for p in (folder, *folder.parents) if not os.path.lexists(p)]  # nearest first: removed in this order
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = _lock(folder)
    except OSError as e:
        _remove_empty(made)
        raise StorageError(f"{folder}: cannot create the folder ({e.strerror or e})") from None
    except StorageError:
        _remove_empty(made)
        raise
    try:
        if lock is not None:  # no lock, no knowing whether a hidden folder's maker still runs: left alone
            _recover(folder)
        try:
            stage = Path(tempfile.mkdtemp(**_hidden(NEW), dir=folder))
        except OSError as e:
            _remove_empty(made)
            raise StorageError(f"{folder}: cannot write into the folder ({e.strerror or e})") from None
        try:
            yield stage
            _swap_in(stage, folder, {*replaces, *(name + ".tmp" for name in replaces)}, marker)
        except BaseException as e:
            shutil.rmtree(stage, ignore_errors=True)
            _remove_empty(made)
            if isinstance(e, CaptionerError) and str(stage) in str(e):
                raise type(e)(str(e).replace(str(stage), str(folder))) from None
            raise
        shutil.rmtree(stage, ignore_errors=True)
    finally:
        if lock is not None:
            os.close(lock)


def _lock(folder: Path) -> int | None:
    """An open descriptor of `folder` holding its exclusive flock (no lock file written into the export), so two
    exports never interleave their swaps; one StorageError line when another process holds it. None where the
    system has no flock or the file system refuses it: the export goes on unlocked, as before locks."""
    if fcntl is None:
        return None
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a folder one may write into but not list
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StorageError(f"{folder}: {BUSY}") from None
        return None
    return fd


def _recover(folder: Path) -> None:
    """Clear the hidden folders a killed export left in `folder` (its lock is free, so their maker is dead): a new
    set never swapped in is deleted; a set aside is deleted when its swap completed (`folder` holds that swap's
    marker), else moved back first, so a swap cut short leaves the earlier complete set, nothing lost."""
    for name in sorted(os.listdir(folder)):
        tag = _tag(name)
        if tag.startswith(EARLIER) and not os.path.lexists(folder / tag[len(EARLIER):]):
            _move_back(folder / name, folder, tag[len(EARLIER):])
        if tag == NEW or tag.startswith(EARLIER):  # an untagged one, an earlier version's, is left alone as before
            shutil.rmtree(folder / name, ignore_errors=True)


def _move_back(aside: Path, folder: Path, marker: str) -> None:
    """Move the entries of `aside` back into `folder`, each replacing a same-named entry of the new set, `marker`
    last: killed midway, `folder` still lacks it and the next export moves the rest back."""
    try:
        for name in sorted(os.listdir(aside), key=lambda name: name == marker):
            target = folder / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif os.path.lexists(target):
                target.unlink()
            os.rename(aside / name, target)
    except OSError as e:
        raise StorageError(f"{folder}: an export was killed while swapping files in, and its earlier files could not "
                           f"be moved back ({e.strerror or e}); they are in {aside}") from None


def _swap_in(stage: Path, folder: Path, replaces: set[str], marker: str) -> None:
    """Move `folder`'s entries named in `replaces` (or in `stage`) aside, `marker` first, then `stage`'s entries
    in, `marker` last, then remove those set aside; any exception moves everything back (an OSError as one
    StorageError)."""
    new = sorted(os.listdir(stage), key=lambda name: name == marker)
    earlier = sorted((name for name in replaces | set(new) if os.path.lexists(folder / name)),
                     key=lambda name: name != marker)
    try:
        aside = Path(tempfile.mkdtemp(**_hidden(EARLIER + marker), dir=folder))
    except OSError as e:
        raise StorageError(f"{folder}: cannot write into the folder ({e.strerror or e})") from None
    moved: list[tuple[Path, Path]] = []
    try:
        for source, target in [(folder / n, aside / n) for n in earlier] + [(stage / n, folder / n) for n in new]:
            os.rename(source, target)
            moved.append((source, target))
    except BaseException as e:  # Ctrl-C too
        reason = f"could not move the new files in ({e.strerror or e})" if isinstance(e, OSError) else "stopped"
        try:
            for source, target in reversed(moved):
                os.rename(target, source)
        except OSError:
            raise StorageError(f"{folder}: {reason}, nor the earlier files back: they are in {aside}") from None
        shutil.rmtree(aside, ignore_errors=True)
        if isinstance(e, OSError):
            raise StorageError(f"{folder}: {reason}; the earlier files are kept") from None
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _remove_empty(folders: list[Path]) -> None:
    """Remove `folders`, nearest first, each only while empty (those a failed write had made)."""
    for path in folders:
        with contextlib.suppress(OSError):
            path.rmdir()


def sha256_of(path: str | Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks (a model file never sits in memory twice)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


REEXPORT = "re-export the checkpoint"


def verify_file(path: Path, sha256: str, listed_in: Path, size: int | None = None, remedy: str = REEXPORT,
                digest: bool = True) -> None:
    """A missing, truncated or altered file `listed_in` records is one ExportError ending with `remedy`; without
    `digest`, its size alone is checked (what the caller sizes before a full read goes first)."""
    if not path.is_file():
        what = "not a regular file (a folder, a pipe or a device)" if path.exists() else "missing"
        raise ExportError(f"{path}: {what} (listed in {listed_in.name}); {remedy}")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool)):
        raise ExportError(f"{listed_in}: records {size!r} bytes for {path.name}, not a whole number; {remedy}")
    found = path.stat().st_size
    if size is not None and found != size:
        raise ExportError(f"{path}: {found} bytes, but {listed_in.name} records {size} (truncated or replaced); "
                          f"{remedy}")
    if digest and sha256_of(path) != sha256:
        raise ExportError(f"{path}: sha256 does not match {listed_in.name} (checksum differs: the file was changed or "
                          f"damaged); {remedy}")
