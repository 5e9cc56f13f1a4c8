"""bf16 autocast on the CPU, chosen by timing it on the machine the run is on.

A CPU with native bf16 (AVX-512 BF16, AMX) multiplies bf16 in hardware, but whether a training
step is faster under bf16 autocast depends on the processor and the model: 1.22x faster on an
AMD EPYC Zen 5, 0.74x (slower) on an Intel Xeon with AVX-512 BF16, for the same shapes_lstm step
(docs/benchmarks.md). So `train.cpu_amp: true` asks for bf16 where it pays: the run's first
steps alternate fp32 and bf16 (they are ordinary training steps, nothing is spent on them),
the median times decide, one log line says which won, and the choice is kept in the train
state, so a resumed run goes on as it started.
"""

from __future__ import annotations

import logging
import statistics

log = logging.getLogger(__name__)

TRIAL_STEPS = 12  # 6 of each, alternating; the first of each precision is a warm-up and not counted


class PrecisionTrial:
    """Which precision each of the first steps runs in, their times, and the decision."""

    def __init__(self, decided: bool | None = None, steps: int = TRIAL_STEPS) -> None:
        self.decided, self.steps = decided, steps
        self.times: dict[bool, list[float]] = {False: [], True: []}
        self.done = 0

    def bf16_now(self) -> bool:
        """The precision of the next step: alternating during the trial, then the winner."""
        return self.decided if self.decided is not None else self.done % 2 == 1

    def record(self, bf16: bool, seconds: float) -> bool | None:
        """A step's time; after the trial's last step, the decision (True: bf16), else None."""
        if self.decided is not None:
            return None
        self.done += 1
        if self.done > 2:  # each precision's first step (kernels chosen, buffers allocated) is a warm-up
            self.times[bf16].append(seconds)
        if self.done < self.steps:
            return None
        fp32, bf16_time = statistics.median(self.times[False]), statistics.median(self.times[True])
        self.decided = bf16_time < fp32
        log.info(
            "train.cpu_amp: a step took %.3f s in bf16 and %.3f s in fp32 on this CPU (median of %d each): %s",
            bf16_time, fp32, len(self.times[True]), "bf16 steps from here" if self.decided else "fp32 steps from here",
        )
        return self.decided
