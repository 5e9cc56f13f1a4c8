"""The suite's own timeline summary (tests/suite_timeline.py) on records whose answer is known."""

from __future__ import annotations

from suite_timeline import summarise


def test_the_summary_counts_busy_cores_the_tail_and_the_tests_that_wait() -> None:
    records = [
        # computes, in a subprocess
        {"test": "a", "worker": "gw0", "start": 100.0, "end": 140.0, "cpu": 38.0, "children_cpu": 30.0},
        {"test": "b", "worker": "gw1", "start": 100.0, "end": 110.0, "cpu": 9.0},
        {"test": "c", "worker": "gw1", "start": 110.0, "end": 130.0, "cpu": 2.0},  # waits: 10% of its wall
        {"test": "d", "worker": "gw1", "start": 130.0, "end": 133.0, "cpu": 0.1},  # waits, but under 5 s
    ]
    lines = summarise(records, cores=2)
    assert lines[0] == "4 tests in 40 s on 2 cores: 49 CPU seconds (30 in child processes), the cores 61% busy"
    assert lines[1] == "  gw0: 1 tests, 40 s in tests, 38 CPU s, done at 40 s"
    assert lines[2] == "  gw1: 3 tests, 33 s in tests, 11 CPU s, done at 33 s"
    assert lines[3] == "  tail: 7 s from the first worker running dry to the end"
    assert lines[5:] == ["      20.0 s wall    2.0 CPU s  c"]
    assert summarise(records, cores=2,
                     started=88.0)[0].endswith("busy; the first began 12 s after pytest started (workers, collection)")
