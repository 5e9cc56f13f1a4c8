"""The thread count follows the free cores during a run (core.runtime.ThreadGovernor): a run
started beside another process does not stay on one thread after it ends, and one started alone
drops a thread when another process takes a core."""

from __future__ import annotations

import torch

from captioner.core.runtime import ThreadGovernor, free_cores, own_running_threads, threads_are_automatic, usable_cores


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_count_follows_the_free_cores_at_most_every_interval(monkeypatch) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        clock, free = Clock(), iter([1, 1, 2])
        governor = ThreadGovernor(every_s=30, clock=clock, free=lambda: next(free))
        assert governor.adjust() is None  # not yet time: nothing is measured
        clock.now = 31
        assert governor.adjust() == 1 and torch.get_num_threads() == 1  # another process took a core
        clock.now = 45
        assert governor.adjust() is None  # within the interval
        clock.now = 62
        assert governor.adjust() is None and torch.get_num_threads() == 1  # still busy: no change, no log
        clock.now = 93
        assert governor.adjust() == 2 and torch.get_num_threads() == 2  # it ended: the core comes back
        assert governor.changes == [(2, 1), (1, 2)]
    finally:
        torch.set_num_threads(before)


def test_the_free_cores_are_counted_without_this_process_own_threads() -> None:
    assert own_running_threads() >= 1  # the thread asking is running
    assert ThreadGovernor().free is free_cores  # the count a command starts with, measured again mid-run
    free = free_cores()
    assert 1 <= free <= usable_cores()


def test_only_an_automatic_count_is_governed(monkeypatch) -> None:
    monkeypatch.delenv("CAPTIONER_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert threads_are_automatic(0)
    assert not threads_are_automatic(1)  # train.threads
    monkeypatch.setenv("CAPTIONER_THREADS", "2")
    assert not threads_are_automatic(0)
    monkeypatch.delenv("CAPTIONER_THREADS")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun splits the cores itself
    assert not threads_are_automatic(0)
