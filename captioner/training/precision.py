"""The precision of a CPU run's training steps (`train.cpu_amp`), decided before its first step.

`fp32`, `bf16` (autocast; weights and loss stay fp32; emulated where not native), or `auto`: bf16 where
the CPU has native bf16 and a timed calibration on synthetic batches finds it faster. The calibration
draws nothing from the run's random streams and is kept per machine and shapes (core/machine_cache.py),
so every run of a config on a machine takes the same precision; last.pt keeps it for `--resume`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import statistics
import time
from dataclasses import dataclass

import torch

from captioner.core import machine_cache
from captioner.core.config_sections import Config
from captioner.core.process_settings import cpu_has_native_bf16
from captioner.data.batching import CaptionBatch
from captioner.models.captioner import Captioner
from captioner.training.loop import caption_loss

log = logging.getLogger(__name__)

CALIBRATION = "cpu_bf16"  # the decisions' prefix in the machine cache
TIMED_STEPS = 3  # per precision, after one warm-up each (kernels chosen, buffers allocated)
CAPTIONS_PER_IMAGE = 5  # captions_per_image: all trains on every reference; most data sets have five


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run's steps take, and why (for its log line)."""

    bf16: bool
    reason: str


def choose_cpu_bf16(config: Config, model: Captioner, encoded: bool,
                    feature_shape: tuple[int, ...] | None) -> PrecisionChoice:
    """A new run's precision on the CPU, as `train.cpu_amp` asks. `auto`'s calibration is recalled, else
    measured by the first process that asks and kept for every other (torchrun's ranks take one decision)."""
    mode = config.train.cpu_amp
    if mode != "auto":
        return PrecisionChoice(mode == "bf16", f"train.cpu_amp {mode}")
    if not cpu_has_native_bf16():
        return PrecisionChoice(False, "train.cpu_amp auto: this CPU has no native bf16")
    name = calibration_name(config, encoded, feature_shape)
    decision, _ = machine_cache.decided(name, lambda: time_precisions(model, config, encoded, feature_shape), _valid)
    faster = "faster" if decision["bf16"] else "slower"
    return PrecisionChoice(decision["bf16"], f"train.cpu_amp auto: a step of this run's shapes took "
                           f"{decision['bf16_ms']:.0f} ms in bf16 and {decision['fp32_ms']:.0f} ms in fp32 on this CPU "
                           f"(bf16 {faster})")


def machine_would_choose(config: Config, encoded: bool, feature_shape: tuple[int, ...] | None) -> bool | None:
    """What `auto` takes on the local machine for these shapes, without measuring: None when no
    calibration is kept here (a resumed run does not calibrate: its checkpoint has decided)."""
    if not cpu_has_native_bf16():
        return False
    known = machine_cache.recall(calibration_name(config, encoded, feature_shape))
    return known["bf16"] if _valid(known) else None


def _valid(known: object) -> bool:
    return isinstance(known, dict) and isinstance(known.get("bf16"), bool) and all(
        isinstance(known.get(k), (int, float)) for k in ("bf16_ms", "fp32_ms"))


def calibration_name(config: Config, encoded: bool, feature_shape: tuple[int, ...] | None) -> str:
    """The machine cache's key for a run's shapes: the model, the batch, the input (images of a
    size, or stored features of a shape) and the stage."""
    data = config.data
    shapes = {
        "model": dataclasses.asdict(config.model),
        "batch": data.batch_size, "captions": data.captions_per_image, "length": data.max_caption_length,
        "input": list(feature_shape) if encoded and feature_shape else data.image_size, "stage": config.train.stage,
    }
    digest = hashlib.sha1(json.dumps(shapes, sort_keys=True).encode()).hexdigest()[:12]
    return f"{CALIBRATION}:{config.model.decoder.type}:{digest}"


def time_precisions(model: Captioner, config: Config, encoded: bool, feature_shape: tuple[int, ...] | None,
                    steps: int = TIMED_STEPS) -> dict:
    """Forward and backward passes of a copy of `model` over one synthetic batch of the run's
    shapes, fp32 and bf16 alternating, each precision's first pass a warm-up: {"bf16": whether it is faster,
    "bf16_ms", "fp32_ms"}, the medians. The global generator is forked: the run's stream stays where it was."""
    trial = copy.deepcopy(model).train()  # batch-norm statistics move in train mode: not the run's
    batch = synthetic_batch(config, len(model.vocab), encoded, feature_shape)
    times: dict[bool, list[float]] = {False: [], True: []}
    with torch.random.fork_rng(devices=[]):
        for round_ in range(steps + 1):
            for bf16 in (False, True):
                started = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss, _ = caption_loss(trial, batch, config, encoded)
                loss.backward()
                trial.zero_grad(set_to_none=True)
                if round_:  # the first round is the warm-up
                    times[bf16].append(time.perf_counter() - started)
    fp32_ms, bf16_ms = (statistics.median(times[p]) * 1e3 for p in (False, True))
    log.debug("train.cpu_amp: calibration, median of %d steps: bf16 %.1f ms, fp32 %.1f ms", steps, bf16_ms, fp32_ms)
    return {"bf16": bf16_ms < fp32_ms, "bf16_ms": round(bf16_ms, 2), "fp32_ms": round(fp32_ms, 2)}


def synthetic_batch(config: Config, vocab_size: int, encoded: bool,
                    feature_shape: tuple[int, ...] | None) -> CaptionBatch:
    """A batch of the run's shapes from a generator of its own: `data.batch_size` images (or stored
    feature rows of `feature_shape`), each with one caption (five for captions_per_image all) of
    the longest length a training caption can have."""
    generator = torch.Generator().manual_seed(0)
    data = config.data
    B = data.batch_size
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
