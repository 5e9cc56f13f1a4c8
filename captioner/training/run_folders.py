"""What a training run checks of its folders as it starts, before its work: an earlier run in train.out_dir (refused
without --resume), a run training there now (refused: a run holds its folder for its life), and the folders it
makes: those it keeps in train.out_dir (its TensorBoard events) and data.feature_store, when the user places the
store. A file where one goes, or a place below a file, is said in one line, and the file is left as it is."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from captioner.core.config_sections import Config
from captioner.core.errors import CaptionerError, CheckpointError, ConfigError, FeatureStoreError, StorageError
from captioner.core.files import HeldElsewhere, folder_problem, hold_lock_file, make_folder
from captioner.core.machine_cache import folder_lock_file
from captioner.training.history import CURVES, FINISHED, METRICS, RUN_CONFIG, STEP_LOSSES

if TYPE_CHECKING:  # annotations only: the folder checks load no torch (scripts/quickstart.sh asks one)
    from captioner.training.distributed import Distributed

RUN_FOLDERS = {"tensorboard": "its TensorBoard events"}  # made in train.out_dir by every run's rank 0
# The files every run writes in train.out_dir: a folder of one of these names would fail its first write, an epoch in
# (FINISHED and CURVES: at its end); a pipe would hold the write forever
RUN_FILES = ("best.pt", "last.pt", METRICS, STEP_LOSSES, "vocab.json", RUN_CONFIG, FINISHED, CURVES)
# The files that make a folder a run's: a new run writes them anew, so their presence is refused without --resume
RUN_CHECKPOINTS = ("best.pt", "last.pt")


@contextlib.contextmanager
def run_folder_held(config: Config, resume: bool, ctx: Distributed) -> Iterator[None]:
    """`fit`'s checks of its folders, before any work, then train.out_dir held by rank 0 until the run ends, however
    it ends: a second run into it (the command started twice, or a job started again while the first still runs) is
    refused in one line instead of writing its checkpoints over the first's. Rank 0's view decides (it alone writes
    the folder), and every rank stops with its one line, none left waiting for rank 0 in a collective."""
    problem, lock = None, None
    if ctx.is_main:
        try:
            check_run_folders(config)
            if not resume:
                require_no_run(config.train.out_dir)
            lock = hold_run_folder(config.train.out_dir)
        except CaptionerError as e:
            problem = e
    try:
        ctx.agree(problem)
        yield
    finally:
        if lock is not None:
            os.close(lock)  # the lock goes with it


def hold_run_folder(out_dir: str | Path) -> int | None:
    """The run folder `out_dir`, made, and held by this process (`core.files.hold_lock_file`) through its lock file in
    the machine's cache (`folder_lock_file`: a refused run leaves the folder as it was); one StorageError line naming
    the process that holds it."""
    folder = make_folder(out_dir, f"train.out_dir={out_dir}")
    try:
        return hold_lock_file(folder_lock_file("run", folder))
    except HeldElsewhere as e:
        who = f"another training run (process {e.pid})" if e.pid else "another training run"
        raise StorageError(f"train.out_dir={out_dir}: {who} is writing into this folder; wait for it to end, or "
                           "give another train.out_dir") from None


def require_no_run(out_dir: str | Path) -> None:
    """A run started without --resume: a train.out_dir that holds no run's checkpoint, since a new run would write
    its best.pt, last.pt and metrics.csv over the earlier run's. Other files (notes, an empty tensorboard folder, a
    run that failed before its first checkpoint) do not make a run."""
    folder = Path(out_dir)
    held = [name for name in RUN_CHECKPOINTS if (folder / name).is_file()]  # a folder so named: check_run_folders
    if not held:
        return
    resume = "continue it with --resume, or " if "last.pt" in held else ""  # --resume reads last.pt
    raise ConfigError(f"train.out_dir={folder} already holds a run ({', '.join(held)}): {resume}"
                      "give another train.out_dir (or delete it)")


def check_run_folders(config: Config) -> None:
    """Refuse, in one line, a file in train.out_dir named as a folder every run makes there (RUN_FOLDERS), a
    folder, pipe or device named as a file it writes there (RUN_FILES), or a data.feature_store that is a file or
    lies below one; seen without making anything. (The default store in train.out_dir, made only by a run that uses
    it, and a place the OS refuses for other reasons, are said when the store's folder is made, before any image is
    encoded.)"""
    out_dir = Path(config.train.out_dir)
    for name, what in RUN_FOLDERS.items():
        if os.path.lexists(out_dir / name) and not (out_dir / name).is_dir():
            raise StorageError(f"train.out_dir={out_dir}: {name} is a file, where the run keeps {what} in a "
                               f"folder; move it, or set another train.out_dir")
    for name in RUN_FILES:
        what = file_problem(out_dir / name)
        if what is not None:
            raise StorageError(f"train.out_dir={out_dir}: {name} is {what}, where the run writes its {name}; move "
                               "it, or set another train.out_dir")
    store = config.data.feature_store if config.train.cache_features else None
    problem = folder_problem(Path(store)) if store else None
    if problem is not None:
        raise FeatureStoreError(f"data.feature_store={store}: {problem}")


def file_problem(path: Path) -> str | None:
    """What is at `path` where a run writes a file, in words, if not a file or nothing (a link leading nowhere
    is written through): a folder, a pipe, a device or a socket, or a loop of links; else None."""
    if not os.path.lexists(path):
        return None
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"a link that cannot be followed ({e.strerror or e})"
    if stat.S_ISDIR(mode):
        return "a folder"
    return None if stat.S_ISREG(mode) else "not a regular file (a pipe, a device or a socket)"


def require_resumable(last: Path) -> None:
    """--resume's last.pt: a file; a folder, a link leading to no file, or nothing there is one line saying which
    (the command's check before any data is read, and training's own)."""
    if last.is_dir():
        raise CheckpointError(f"{last}: a folder, not the checkpoint --resume continues from")
    if last.is_symlink() and not last.exists():
        raise CheckpointError(f"{last}: a link that leads to no file (a loop, or its target gone); "
                              "--resume continues from the checkpoint it names")
    if not last.is_file():
        raise CheckpointError(f"{last}: nothing to resume (no last.pt in train.out_dir); "
                              "leave out --resume to start the run")
