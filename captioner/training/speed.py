"""The speed choices that change a run's numbers, decided before its first step and kept in last.pt.

Thread count, the CPU's dense-products route (models/products.py) and CPU bf16 (training/precision.py)
each change how a step's floats are summed; made once from settings and per-machine calibrations, they
make a config and seed give the same weights on one machine. An explicit setting wins over a checkpoint's.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from captioner.core.config_sections import Config
from captioner.core.process_settings import ENV_THREADS, ThreadGovernor, free_cores, run_threads, threads_are_automatic
from captioner.models import products
from captioner.models.captioner import Captioner
from captioner.training.distributed import Distributed
from captioner.training.precision import choose_cpu_bf16, machine_would_choose

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpeedChoices:
    """What a run's steps run with: kept in last.pt's train state (`to_dict`)."""

    bf16: bool  # steps under bf16 autocast (CUDA: train.amp; CPU: train.cpu_amp's decision)
    threads: int | None  # torch's intra-op threads; None: they follow the free cores (train.follow_free_cores)
    onednn_products: bool | None  # CPU: fp32 dense products through oneDNN (models/products.py); None on CUDA

    def to_dict(self) -> dict:
        return {"cpu_bf16": self.bf16, "threads": self.threads, "onednn_products": self.onednn_products}


def decide_threads(config: Config, saved: dict | None, source: str) -> tuple[int | None, ThreadGovernor | None]:
    """The run's thread count, set now (before the feature store is built: its sums count too),
    and the governor that changes it mid-run where `train.follow_free_cores` asks for one."""
    if config.train.follow_free_cores and threads_are_automatic(config.train.threads):
        torch.set_num_threads(free_cores())
        return None, ThreadGovernor()
    explicit = not threads_are_automatic(config.train.threads)
    recorded = saved.get("threads") if saved else None
    threads = run_threads(config.train.threads)
    if isinstance(recorded, int) and recorded > 0 and recorded != threads:
        if explicit:
            log.warning("threads: %d as set (%s), where %s trained with %d: it goes on, not bit for bit",
                        threads, "train.threads" if config.train.threads else _explicit_source(), source, recorded)
        else:
            log.info("threads: %d, as %s trained with (this machine alone would take %d)", recorded, source, threads)
            threads = recorded
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads, None


def _explicit_source() -> str:
    return f"${ENV_THREADS}" if os.environ.get(ENV_THREADS) else "torchrun's OMP_NUM_THREADS"


def decide_steps(config: Config, ctx: Distributed, model: Captioner, encoded: bool,
                 feature_shape: tuple[int, ...] | None, saved: dict | None, source: str) -> tuple[bool, bool | None]:
    """(bf16 steps, the products route) for the run, decided before its first step: on CUDA
    `train.amp` alone; on the CPU the products route first (the calibration's fp32 steps take it),
    then the precision. A resumed run takes its checkpoint's. Every rank takes rank 0's."""
    if ctx.device.type != "cpu":
        return config.train.amp, None
    route = saved.get("onednn_products") if saved else None
    if isinstance(route, bool):
        products.take_route(route, source)
    onednn = products.route_taken()
    bf16 = resumed_precision(config, saved, encoded, feature_shape, source)
    if bf16 is None and ctx.is_main:
        choice = choose_cpu_bf16(config, model, encoded, feature_shape)
        log.debug("%s", choice.reason)
        bf16 = choice.bf16
    if ctx.enabled:
        bf16 = bool(ctx.broadcast(bf16 if ctx.is_main else None))
    return bool(bf16), onednn


def resumed_precision(config: Config, saved: dict | None, encoded: bool, feature_shape: tuple[int, ...] | None,
                      source: str) -> bool | None:
    """The checkpoint's precision where `train.cpu_amp` is auto (a value set explicitly wins,
    and says so when it differs); None for a new run, or a checkpoint that recorded none."""
    recorded = saved.get("cpu_bf16") if saved else None
    if not isinstance(recorded, bool):
        return None
    mode = config.train.cpu_amp
    if mode != "auto":
        if (mode == "bf16") != recorded:
            log.warning("train.cpu_amp %s as set, where %s trained in %s: it goes on, not bit for bit",
                        mode, source, "bf16" if recorded else "fp32")
        return mode == "bf16"
    here = machine_would_choose(config, encoded, feature_shape)
    if here is not None and here != recorded:
        log.info("train.cpu_amp auto: %s steps, as %s trained (this machine alone would take %s)",
                 "bf16" if recorded else "fp32", source, "bf16" if here else "fp32")
    return recorded


def describe(choices: SpeedChoices, device: torch.device) -> str:
    """The run's log line: what its steps run with."""
    if device.type != "cpu":
        return f"steps in {'bf16 autocast' if choices.bf16 else 'fp32'} on {device}"
    threads = (f"{choices.threads} thread{'s' if choices.threads != 1 else ''}" if choices.threads
               else "threads following the free cores")
    route = "oneDNN" if choices.onednn_products else "F.linear"
    return (f"steps in {'bf16' if choices.bf16 else 'fp32'}, {threads}, dense products through {route} "
            "(kept in last.pt for --resume)")
