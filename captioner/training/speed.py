"""The speed choices that change a run's numbers, decided before its first step and kept in last.pt.

Thread count, the CPU's dense-products route (models/products.py) and the precision of a CPU run's steps
(`train.cpu_amp`) each change how a step's floats are summed; made once from settings and per-machine
calibrations, they make a config and seed give the same weights on one machine. An explicit setting wins over a
checkpoint's. `train.cpu_amp auto` takes bf16 where the CPU has it natively and a timed calibration on synthetic
batches of the size the run's steps take, drawing nothing from the run's random streams, finds it faster (kept per
machine and shapes)."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
import statistics
import time
from dataclasses import dataclass

import torch

from captioner.core import machine_cache
from captioner.core.config_sections import Config
from captioner.core.errors import ConfigError, first_line
from captioner.core.process_settings import (ENV_THREADS, ThreadGovernor, cpu_has_native_bf16, free_cores, run_threads,
                                             threads_are_automatic, usable_cores)
from captioner.data.batching import CaptionBatch
from captioner.models import products
from captioner.models.captioner import Captioner
from captioner.training.distributed import Distributed
from captioner.training.loop import caption_loss

log = logging.getLogger(__name__)

CALIBRATION = "cpu_bf16"  # the precision decisions' prefix in the machine cache
TIMED_STEPS = 3  # per precision, after one warm-up each (kernels chosen, buffers allocated)
CAPTIONS_PER_IMAGE = 5  # captions_per_image: all trains on every reference; most data sets have five


@dataclass(frozen=True)
class SpeedChoices:
    """What a run's steps run with: kept in last.pt's train state (`to_dict`)."""

    bf16: bool  # steps under bf16 autocast (CUDA: train.amp; CPU: train.cpu_amp's decision)
    threads: int | None  # torch's intra-op threads; None: they follow the free cores (train.follow_free_cores)
    onednn_products: bool | None  # CPU: fp32 dense products through oneDNN (models/products.py); None on CUDA
    gram_mm: bool | None = None  # on that route: weight gradients by torch.mm (else through oneDNN); None on CUDA
    grad_mm: bool | None = None  # on that route: input gradients by torch.mm (else through oneDNN); None on CUDA

    def to_dict(self) -> dict:
        return {"cpu_bf16": self.bf16, "threads": self.threads, "onednn_products": self.onednn_products,
                "gram_mm": self.gram_mm, "grad_mm": self.grad_mm}


def decide_threads(config: Config, saved: dict | None, source: str) -> tuple[int | None, ThreadGovernor | None]:
    """The run's thread count, set now (before the feature store is built: its sums count too),
    and the governor that changes it mid-run where `train.follow_free_cores` asks for one."""
    if config.train.follow_free_cores and threads_are_automatic(config.train.threads):
        torch.set_num_threads(free_cores())
        return None, ThreadGovernor()
    recorded = saved.get("threads") if saved else None
    threads = run_threads(config.train.threads)
    setting = None if threads_are_automatic(config.train.threads) else thread_setting(config)
    if isinstance(recorded, int) and recorded > 0 and recorded != threads:
        if setting is not None:  # set explicitly: it wins over the checkpoint's
            log.warning("threads: %d as set (%s), where %s trained with %d: it goes on, not bit for bit",
                        threads, setting, source, recorded)
        else:
            log.info("threads: %d, as %s trained with (this machine alone would take %d)", recorded, source, threads)
            threads, setting = recorded, f"as {source} trained with"
    cores = usable_cores()
    if threads > cores:  # taken as set or recorded: another count would change the run's sums, and so its weights
        log.warning("threads: %d (%s), more than the %d cores this process may use: its steps will be slower than "
                    "with %d threads; set train.threads=%d for speed (the weights then differ)",
                    threads, setting, cores, cores, cores)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads, None


def thread_setting(config: Config) -> str:
    """What fixed an explicit thread count, for the log: the config, $CAPTIONER_THREADS or torchrun."""
    return ("train.threads" if config.train.threads
            else f"${ENV_THREADS}" if os.environ.get(ENV_THREADS) else "torchrun's OMP_NUM_THREADS")


def decide_steps(config: Config, ctx: Distributed, model: Captioner, encoded: bool,
                 feature_shape: tuple[int, ...] | None, saved: dict | None, source: str,
                 batch: int | None = None) -> tuple[bool, bool | None, bool | None, bool | None]:
    """(bf16 steps, the products route, weight gradients by torch.mm, input gradients by torch.mm) for the run,
    decided before its first step: on CUDA `train.amp` alone; on the CPU the products route first (the
    calibration's fp32 steps take it), then the precision. A resumed run takes its checkpoint's. Every rank
    takes rank 0's. `batch`: the images a step of this rank takes (`rank_batch`); None: data.batch_size."""
    if ctx.device.type != "cpu":
        return config.train.amp, None, None, None
    route = saved.get("onednn_products") if saved else None
    if isinstance(route, bool):  # a choice none recorded: oneDNN's, as before it was made
        products.take_route(route, source, gram_mm=saved.get("gram_mm") is True, grad_mm=saved.get("grad_mm") is True)
    onednn, gram_mm, grad_mm = products.route_taken(), products.gram_by_mm(), products.grad_by_mm()
    bf16 = resumed_precision(config, saved, encoded, feature_shape, source, batch)
    if bf16 is None and ctx.is_main:
        choice = choose_cpu_bf16(config, model, encoded, feature_shape, batch)
        log.debug("%s", choice.reason)
        bf16 = choice.bf16
    if ctx.enabled:  # every rank takes rank 0's
        bf16 = bool(ctx.broadcast(bf16))
    return bool(bf16), onednn, gram_mm, grad_mm


def resumed_precision(config: Config, saved: dict | None, encoded: bool, feature_shape: tuple[int, ...] | None,
                      source: str, batch: int | None = None) -> bool | None:
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
    here = machine_would_choose(config, encoded, feature_shape, batch)
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
    by_mm = [name for name, chosen in (("weight", choices.gram_mm), ("input", choices.grad_mm)) if chosen]
    route = "F.linear" if not choices.onednn_products else "oneDNN" + (
        f" ({' and '.join(by_mm)} gradients by torch.mm)" if by_mm else "")
    return (f"steps in {'bf16' if choices.bf16 else 'fp32'}, {threads}, dense products through {route} "
            "(kept in last.pt for --resume)")


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run's steps take, and why (for its log line)."""

    bf16: bool
    reason: str


def choose_cpu_bf16(config: Config, model: Captioner, encoded: bool, feature_shape: tuple[int, ...] | None,
                    batch: int | None = None) -> PrecisionChoice:
    """A new run's precision on the CPU, as `train.cpu_amp` asks (bf16: autocast, weights and loss stay fp32).
    `auto`'s calibration is recalled, else measured by the first process that asks and kept for every other
    (torchrun's ranks take one decision), on batches of `batch` images (None: data.batch_size)."""
    mode = config.train.cpu_amp
    if mode != "auto":
        return PrecisionChoice(mode == "bf16", f"train.cpu_amp {mode}")
    if not cpu_has_native_bf16():
        return PrecisionChoice(False, "train.cpu_amp auto: this CPU has no native bf16")
    name = calibration_name(config, encoded, feature_shape, batch)
    decision, _ = machine_cache.decided(name, lambda: measure_precisions(model, config, encoded, feature_shape, batch),
                                        _valid)
    return PrecisionChoice(decision["bf16"], f"train.cpu_amp auto: a step of this run's shapes took "
                           f"{decision['bf16_ms']:.0f} ms in bf16 and {decision['fp32_ms']:.0f} ms in fp32 on this CPU "
                           f"(bf16 {'faster' if decision['bf16'] else 'slower'})")


def machine_would_choose(config: Config, encoded: bool, feature_shape: tuple[int, ...] | None,
                         batch: int | None = None) -> bool | None:
    """What `auto` takes on the local machine for these shapes, without measuring: None when no
    calibration is kept here (a resumed run does not calibrate: its checkpoint has decided)."""
    if not cpu_has_native_bf16():
        return False
    known = machine_cache.recall(calibration_name(config, encoded, feature_shape, batch))
    return known["bf16"] if _valid(known) else None


def _valid(known: object) -> bool:
    return isinstance(known, dict) and isinstance(known.get("bf16"), bool) and all(
        isinstance(known.get(k), (int, float)) for k in ("bf16_ms", "fp32_ms"))


def calibration_name(config: Config, encoded: bool, feature_shape: tuple[int, ...] | None,
                     batch: int | None = None) -> str:
    """The machine cache's key for a run's shapes: the model, the batch a step takes (`batch`, else
    data.batch_size: the same key as before for every run whose data fills its batches), the input (images
    of a size, or stored features of a shape) and the stage."""
    data = config.data
    shapes = {
        "model": dataclasses.asdict(config.model),
        "batch": batch or data.batch_size, "captions": data.captions_per_image, "length": data.max_caption_length,
        "input": list(feature_shape) if encoded and feature_shape else data.image_size, "stage": config.train.stage,
    }
    digest = hashlib.sha1(json.dumps(shapes, sort_keys=True).encode()).hexdigest()[:12]
    return f"{CALIBRATION}:{config.model.decoder.type}:{digest}"


def measure_precisions(model: Captioner, config: Config, encoded: bool, feature_shape: tuple[int, ...] | None,
                       batch: int | None = None) -> dict:
    """`time_precisions`, or one line when its step finds no memory: the run's steps, of the same batch, would
    not either, and a precision chosen for want of memory would change the run's weights unsaid."""
    try:
        return time_precisions(model, config, encoded, feature_shape, batch=batch)
    except (MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            raise
        raise ConfigError(f"train.cpu_amp auto: a step of {batch or config.data.batch_size} images found no memory "
                          f"to run in ({first_line(e, 120)}); lower data.batch_size, or set train.cpu_amp "
                          "to fp32 or bf16") from None


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` says an allocation failed (Python's MemoryError, torch's CPU or device allocators)."""
    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(error)


def time_precisions(model: Captioner, config: Config, encoded: bool, feature_shape: tuple[int, ...] | None,
                    steps: int = TIMED_STEPS, batch: int | None = None) -> dict:
    """Forward and backward passes of a copy of `model` over one synthetic batch of the run's
    shapes (`batch` images; None: data.batch_size), fp32 and bf16 alternating, each precision's first pass a
    warm-up: {"bf16": whether it is faster, "bf16_ms", "fp32_ms"}, the medians. The global generator is forked:
    the run's stream stays where it was."""
    trial = copy.deepcopy(model).train()  # batch-norm statistics move in train mode: not the run's
    synthetic = synthetic_batch(config, len(model.vocab), encoded, feature_shape, batch)
    times: dict[bool, list[float]] = {False: [], True: []}
    with torch.random.fork_rng(devices=[]):
        for round_ in range(steps + 1):
            for bf16 in (False, True):
                started = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss, _ = caption_loss(trial, synthetic, config, encoded)
                loss.backward()
                trial.zero_grad(set_to_none=True)
                if round_:  # the first round is the warm-up
                    times[bf16].append(time.perf_counter() - started)
    # Rounded before they are compared: the decision is the one the kept times show (a tie keeps fp32).
    fp32_ms, bf16_ms = (round(statistics.median(times[p]) * 1e3, 2) for p in (False, True))
    log.debug("train.cpu_amp: calibration, median of %d steps: bf16 %.1f ms, fp32 %.1f ms", steps, bf16_ms, fp32_ms)
    return {"bf16": bf16_ms < fp32_ms, "bf16_ms": bf16_ms, "fp32_ms": fp32_ms}


def synthetic_batch(config: Config, vocab_size: int, encoded: bool, feature_shape: tuple[int, ...] | None,
                    batch: int | None = None) -> CaptionBatch:
    """A batch of the run's shapes from a generator of its own: `batch` images (None: data.batch_size; a
    step of a dataset smaller than that takes fewer), or stored feature rows of `feature_shape`, each with
    one caption (five for captions_per_image all) of the longest length a training caption can have."""
    generator = torch.Generator().manual_seed(0)
    data = config.data
    B = batch or data.batch_size
    C = B * (CAPTIONS_PER_IMAGE if data.captions_per_image == "all" else 1)
    T = data.max_caption_length + 2  # <bos> words <eos>
    if encoded and feature_shape is not None:
        images = torch.randn(B, *feature_shape, generator=generator).half()  # (B, N, D) as the store keeps them
    else:
        size = data.image_size
        images = torch.randint(0, 256, (B, 3, size, size), generator=generator, dtype=torch.uint8)  # (B, 3, H, W)
    first_word = 4 if vocab_size > 4 else 0  # after <pad> <bos> <eos> <unk>
    tokens = torch.randint(first_word, max(vocab_size, first_word + 1), (C, T), generator=generator)  # (C, T)
    lengths = torch.full((C,), T)  # (C,)
    image_rows = torch.arange(C) % B  # (C,)
    return CaptionBatch(images, tokens, lengths, image_rows, torch.arange(B))
