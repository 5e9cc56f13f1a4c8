"""Each pytest worker rewrites the asserts of its share of the test modules into pytest's cache before it collects,
so that the other workers read them there instead of rewriting every module too.

pytest rewrites a test module's asserts on import and keeps the result in tests/__pycache__/*-pytest-*.pyc, but not
where bytecode may not be written (PYTHONDONTWRITEBYTECODE, as in CI): there each worker of a fresh clone rewrote
all of them, 5.5 CPU s a worker before its first test. Here worker k of n writes every n-th module's cache, from
the k-th, whatever the environment says of bytecode (run_tests.sh compiles the tests' modules too), and then
collects as usual. pytest's rewriting is not public API: where it moved, nothing is shared and pytest rewrites alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def share(files: list[Path], worker: str | None, workers: int) -> list[Path]:
    """The modules worker `worker` ("gw0", ...) of `workers` rewrites: every n-th, from its own number on."""
    if worker is None or workers < 2 or not worker.startswith("gw") or not worker[2:].isdigit():
        return []
    return files[int(worker[2:])::workers]


def collected_modules(args: list[str]) -> list[Path]:
    """The test modules under the paths pytest was given (a node id counts as its file)."""
    given = [Path(arg.split("::")[0]).resolve() for arg in args]
    return [path for path in sorted(TESTS.glob("test_*.py"))
            if any(path == root or root in path.parents for root in given)]


def write_rewritten(files: list[Path], config: pytest.Config) -> int:
    """pytest's rewritten bytecode of each of `files` not cached yet, written where pytest reads it; how many."""
    try:
        from _pytest.assertion.rewrite import (PYC_TAIL, _read_pyc, _rewrite_test, _write_pyc, assertstate_key,
                                               get_cache_dir)
    except ImportError:
        return 0
    state = config.stash.get(assertstate_key, None)
    if state is None:  # --assert=plain: nothing is rewritten
        return 0
    written = 0
    for path in files:
        folder = get_cache_dir(path)
        pyc = folder / (path.name[:-3] + PYC_TAIL)
        if _read_pyc(path, pyc) is not None:
            continue
        stat, code = _rewrite_test(path, config)
        try:
            folder.mkdir(exist_ok=True)
        except OSError:  # a read-only checkout: pytest rewrites as it imports
            return written
        written += _write_pyc(state, code, stat, pyc)
    return written


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session):  # noqa: ANN201 (a hook wrapper)
    mine = share(collected_modules(session.config.args), os.environ.get("PYTEST_XDIST_WORKER"),
                 int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    write_rewritten(mine, session.config)
    return (yield)
