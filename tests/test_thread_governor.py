"""A training run's thread count: fixed before its first step, every usable core unless set, kept
by --resume (training/speed.py); and, where `train.follow_free_cores` asks for it, following the
free cores during the run (core.process_settings.ThreadGovernor): a run started beside another process
does not stay on one thread after it ends, and one started alone drops a thread when another
process takes a core."""

from __future__ import annotations

import torch

from captioner.core.process_settings import (THREADS_PAY, ThreadGovernor, free_cores, own_running_threads,
                                             threads_are_automatic, threads_that_pay, usable_cores)


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


def automatic_threads(monkeypatch, usable: int = 4, free: int = 1) -> None:
    """A machine of `usable` cores, `free` of them idle now, and nothing setting the count."""
    import captioner.core.process_settings as process_settings
    import captioner.training.speed as speed

    monkeypatch.delenv("CAPTIONER_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(process_settings, "usable_cores", lambda: usable)
    monkeypatch.setattr(process_settings, "free_cores", lambda: free)
    monkeypatch.setattr(speed, "free_cores", lambda: free)


def test_a_run_takes_every_usable_core_whatever_the_load(monkeypatch) -> None:
    """The free cores change with the load and a run's sums with its thread count: two runs of one
    config on one machine must not differ because another process was running at the start of one."""
    from captioner.core.process_settings import run_threads

    automatic_threads(monkeypatch, usable=4, free=1)
    assert run_threads() == 4 and run_threads(3) == 3
    monkeypatch.setenv("CAPTIONER_THREADS", "2")
    assert run_threads() == 2


def test_a_resumed_run_takes_its_recorded_count_unless_one_is_set(monkeypatch, caplog) -> None:
    from captioner.training.speed import decide_threads
    from helpers import tiny_config

    before = torch.get_num_threads()
    try:
        automatic_threads(monkeypatch, usable=4, free=1)
        config = tiny_config()
        assert decide_threads(config, None, "last.pt") == (4, None) and torch.get_num_threads() == 4  # a new run
        with caplog.at_level("INFO", logger="captioner.training.speed"):
            assert decide_threads(config, {"threads": 3}, "last.pt") == (3, None) and torch.get_num_threads() == 3
        assert "threads: 3, as last.pt trained with (this machine alone would take 4)" in caplog.text
        caplog.clear()
        assert decide_threads(tiny_config("train.threads=2"), {"threads": 3}, "last.pt") == (2, None)  # set: it wins
        assert ("threads: 2 as set (train.threads), where last.pt trained with 3: it goes on, not bit for "
                "bit") in caplog.text
        threads, governor = decide_threads(tiny_config("train.follow_free_cores=true"), {"threads": 3}, "last.pt")
        # the free cores, then followed
        assert threads is None and governor is not None and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


class CostClock:
    """A clock each call of `action` advances by its cost at torch's current thread count (the first call at
    each count costs `warmup` seconds), so a choice is tested without timing anything."""

    def __init__(self, costs: dict[int, float], warmup: float = 10.0) -> None:
        self.costs, self.warmup, self.now, self.calls = costs, warmup, 0.0, []

    def __call__(self) -> float:
        return self.now

    def action(self) -> None:
        threads = torch.get_num_threads()
        self.now += self.warmup if threads not in self.calls else self.costs[threads]
        self.calls.append(threads)


def test_a_server_runs_on_every_core_only_where_they_make_a_request_much_faster() -> None:
    before = torch.get_num_threads()
    try:
        clock = CostClock({1: 0.5, 2: 0.25})  # 2x: a large encoder (costs exact in binary)
        assert threads_that_pay(clock.action, 2, clock=clock) == (2, {1: 0.5, 2: 0.25})
        assert torch.get_num_threads() == 2
        assert clock.calls == [1, 2, 2, 1, 1, 2]  # a warm-up with each, then the order alternates
        assert THREADS_PAY > 4 / 3
        clock = CostClock({1: 0.5, 2: 0.375})  # 1.33x: a small model; one core is left to the server
        assert threads_that_pay(clock.action, 2, clock=clock)[0] == 1 and torch.get_num_threads() == 1
        clock = CostClock({1: 0.5, 2: 0.25})
        assert threads_that_pay(clock.action, 2, gain=2.0, clock=clock)[0] == 2  # exactly the gain asked: it pays
        clock = CostClock({1: 0.5})
        assert threads_that_pay(clock.action, 1, clock=clock) == (1, {}) and clock.calls == []  # nothing to time
    finally:
        torch.set_num_threads(before)
