"""Where the suite's time goes: every test's wall and CPU seconds (its own and its waited-for
children's, fixtures included; the children's apart too: interpreters and Java started by tests),
per pytest worker, summarised after the run: how busy the cores were, how long the run's tail kept
some workers idle, and the long tests that mostly wait.

conftest.py imports these hooks. The controller (or the only process, without xdist) names a
folder in $CAPTIONER_TEST_TIMELINE before the workers start; each writes `<worker>.jsonl` there."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

TIMELINE = "CAPTIONER_TEST_TIMELINE"
WAITING = 0.3  # a test whose CPU seconds are under this share of its wall time mostly waits


def cpu_seconds() -> tuple[float, float]:
    """User and system seconds of this process, and of the children it has waited for (those
    forked for it by tests/warm_start.py's server included: their parent is the server)."""
    times = os.times()
    warm = sys.modules.get("warm_start")
    forked = warm.forked_cpu() if warm is not None else 0.0
    return times.user + times.system, times.children_user + times.children_system + forked


KEEP_S = 24 * 3600  # earlier runs' folders are kept a day, to be read, then removed


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller: workers inherit the folder
        for old in Path(tempfile.gettempdir()).glob("captioner-timeline-*"):
            if time.time() - old.stat().st_mtime > KEEP_S:
                shutil.rmtree(old, ignore_errors=True)
        os.environ[TIMELINE] = tempfile.mkdtemp(prefix="captioner-timeline-")
        (Path(os.environ[TIMELINE]) / "started").write_text(repr(time.time()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ANN201 (a hook wrapper)
    start, (own, children) = time.time(), cpu_seconds()
    yield
    folder = os.environ.get(TIMELINE)
    if folder:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        own_after, children_after = cpu_seconds()
        record = {"test": item.nodeid, "worker": worker, "start": start, "end": time.time(),
                  "cpu": own_after - own + children_after - children, "children_cpu": children_after - children}
        with open(Path(folder) / f"{worker}.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")


def summarise(records: list[dict], cores: int, started: float | None = None) -> list[str]:
    """The summary's lines: the run, each worker, the tail, and the long tests that mostly wait;
    with `started` (when pytest began), how long start-up and collection took before the first test."""
    start, end = min(r["start"] for r in records), max(r["end"] for r in records)
    wall, cpu = end - start, sum(r["cpu"] for r in records)
    children = sum(r.get("children_cpu", 0.0) for r in records)
    lines = [f"{len(records)} tests in {wall:.0f} s on {cores} cores: {cpu:.0f} CPU seconds ({children:.0f} in child "
             f"processes), the cores {cpu / (wall * cores):.0%} busy"]
    if started is not None:
        lines[0] += f"; the first began {start - started:.0f} s after pytest started (workers, collection)"
    workers = sorted({r["worker"] for r in records})
    finished = {}
    for worker in workers:
        own = [r for r in records if r["worker"] == worker]
        busy, used = sum(r["end"] - r["start"] for r in own), sum(r["cpu"] for r in own)
        finished[worker] = max(r["end"] for r in own)
        lines.append(f"  {worker}: {len(own)} tests, {busy:.0f} s in tests, {used:.0f} CPU s, done at "
                     f"{finished[worker] - start:.0f} s")
    if len(workers) > 1:
        first_done = min(finished.values())
        lines.append(f"  tail: {end - first_done:.0f} s from the first worker running dry to the end")
    waiting = sorted((r for r in records if r["end"] - r["start"] >= 5
                      and r["cpu"] < WAITING * (r["end"] - r["start"])),
                     key=lambda r: r["start"] - r["end"])
    if waiting:
        lines.append(f"  mostly waiting (CPU under {WAITING:.0%} of wall, 5 s or more):")
        lines += [f"    {r['end'] - r['start']:6.1f} s wall {r['cpu']:6.1f} CPU s  {r['test']}" for r in waiting[:15]]
    return lines


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    folder = os.environ.get(TIMELINE)
    if hasattr(config, "workerinput") or not folder:
        return
    records = [json.loads(line) for path in sorted(Path(folder).glob("*.jsonl"))
               for line in path.read_text().splitlines()]
    if not records:
        return
    terminalreporter.write_sep("=", "suite timeline")
    started = Path(folder) / "started"
    for line in summarise(records, os.cpu_count() or 1, float(started.read_text()) if started.is_file() else None):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"  per test: {folder}/*.jsonl")
