"""Stopping a run cleanly on SIGTERM or SIGINT: finish the step, write last.pt, raise `Interrupted`.

Each rank's vote rides the step's host all-reduce (`Distributed.sum_host`), so all ranks stop after
the same step with no added collective. A repeated SIGTERM changes nothing; a second SIGINT stops at once."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from captioner.training.distributed import Distributed

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPEAT_GRACE_SECONDS = 2.0  # a second SIGINT sooner than this is the same Ctrl-C, delivered twice


class Interrupted(Exception):
    """A signal stopped training after a step; last.pt holds it. `signal` is the signal's number."""

    def __init__(self, signum: int, checkpoint: str, step: int) -> None:
        super().__init__(f"{signal.Signals(signum).name} at step {step}: {checkpoint} saved")
        self.signal, self.checkpoint, self.step = signum, checkpoint, step


class StopSignals:
    """SIGTERM and SIGINT handlers that ask the training loop to stop after its step."""

    def __init__(self) -> None:
        self.received: dict[int, float] = {}  # signal -> when it first came
        self.signal: int | None = None  # the signal every rank agreed to stop on
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """Take over SIGTERM and SIGINT (only the main thread may; elsewhere they stay as they are)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.received.get(signum)
        if first is None:
            self.received[signum] = time.monotonic()
            log.warning("%s received: finishing this step, then saving last.pt", signal.Signals(signum).name)
        elif signum == signal.SIGINT and time.monotonic() - first > REPEAT_GRACE_SECONDS:
            raise KeyboardInterrupt  # Ctrl-C again: stop now (last.pt keeps the previous checkpoint)

    def votes(self) -> list[int]:
        """This rank's (SIGTERM, SIGINT) votes, added to the step's host all-reduce."""
        return [int(signal.SIGTERM in self.received), int(signal.SIGINT in self.received)]

    def stop_after_step(self, summed: Sequence[int], ctx: Distributed) -> bool:
        """Whether to stop after this step. Under torchrun: when any rank voted at the step's start
        (`summed`, the same on every rank); alone: as soon as a signal has come."""
        term, interrupt = summed if ctx.enabled else self.votes()
        if term or interrupt:
            self.signal = signal.SIGTERM if term else signal.SIGINT
        return self.signal is not None
