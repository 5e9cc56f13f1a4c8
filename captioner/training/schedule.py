"""The learning rates: warmup and decay, the global-batch scaling rule and the optimiser's groups."""

from __future__ import annotations

import math

import torch

from captioner.core.config_sections import Config
from captioner.models.captioner import Captioner

DEFAULT_WARMUP_STEPS = 100  # neither train.warmup_epochs nor train.warmup_steps set


def warmup_steps(config: Config, steps_per_epoch: int) -> int:
    """The warmup in optimiser steps: `train.warmup_epochs` through this run's steps per epoch
    (so the same fraction of the run on any number of processes), else `train.warmup_steps`."""
    if config.train.warmup_epochs is not None:
        return round(config.train.warmup_epochs * steps_per_epoch)
    return DEFAULT_WARMUP_STEPS if config.train.warmup_steps is None else config.train.warmup_steps


def lr_scale(config: Config, global_batch: int) -> float:
    """What `train.lr_scaling` multiplies the configured learning rates by at this global batch:
    1 (none), global_batch / base_batch (linear) or its square root (sqrt); base_batch defaults
    to data.batch_size, the global batch of one process."""
    rule = config.train.lr_scaling
    if rule == "none":
        return 1.0
    ratio = global_batch / (config.train.base_batch or config.data.batch_size)
    return ratio if rule == "linear" else math.sqrt(ratio)


def describe_schedule(config: Config, global_batch: int, steps_per_epoch: int) -> str:
    """The learning-rate rule and warmup of this run, for the log at its start."""
    train, scale = config.train, lr_scale(config, global_batch)
    rates = f"lr {train.lr:g}, encoder_lr {train.encoder_lr:g}"
    if train.lr_scaling == "none":
        rates += " as configured (train.lr_scaling none)"
    else:
        base = train.base_batch or config.data.batch_size
        rates += f" x {scale:.4g} ({train.lr_scaling} scaling: global batch {global_batch} / base batch {base})"
    warmup = warmup_steps(config, steps_per_epoch)
    return f"{rates}; warmup {warmup} steps = {warmup / max(1, steps_per_epoch):.3g} epochs, then {train.schedule}"


def make_scheduler(
    optimizer: torch.optim.Optimizer, config: Config, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, then cosine decay to 5% of the peak at the last step (or constant). With the warmup
    in epochs, the schedule is the same function of epochs on any number of processes."""
    warmup = warmup_steps(config, steps_per_epoch)
    total_steps = config.train.epochs * steps_per_epoch

    def factor(step: int) -> float:
        done = step + 1  # steps done after this one
        if done <= warmup:
            return done / warmup
        if config.train.schedule == "constant":
            return 1.0
        progress = min(1.0, (done - warmup) / max(1, total_steps - warmup))
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress))  # cosine to 5% of the peak

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def make_optimizer(model: Captioner, config: Config, scale: float) -> torch.optim.AdamW:
    """AdamW over the decoder at train.lr and the encoder's trainable layers at train.encoder_lr
    (a pretrained encoder) or train.lr (one learning from scratch), both times `scale`."""
    groups = [{"params": list(model.decoder.parameters()), "lr": config.train.lr * scale}]
    encoder_params = [p for p in model.encoder.parameters() if p.requires_grad]
    if encoder_params:
        # A gentler rate fine-tunes pretrained layers; an encoder learning from scratch needs the full one.
        encoder_lr = config.train.encoder_lr if config.model.encoder.pretrained else config.train.lr
        groups.append({"params": encoder_params, "lr": encoder_lr * scale})
    # fused: one kernel for all parameters (fp32 as before), several times faster than the loop over them on the CPU.
    return torch.optim.AdamW(groups, weight_decay=config.train.weight_decay, fused=True)
