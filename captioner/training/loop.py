"""One epoch of training (`train_one_epoch`, any objective, no device read between logs), cross-entropy,
and what stops the epoch: SIGTERM or SIGINT finishes the step, writes last.pt and raises `Interrupted`.
Each rank's vote rides the step's host all-reduce (`Distributed.sum_host`), so all ranks stop after
the same step with no added collective. A repeated SIGTERM changes nothing; a second SIGINT stops at once."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from types import FrameType
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from captioner.core.config_sections import Config
from captioner.core.errors import DatasetError
from captioner.core.progress import progress_bar
from captioner.data.batching import CaptionBatch
from captioner.models.captioner import Captioner
from captioner.models.decoder import DecoderOutput, reads_are_free
from captioner.training.distributed import Distributed
from captioner.training.state import TrainState, check_finite_loss

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
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in SIGNALS}

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


Loss = tuple[torch.Tensor, dict[str, torch.Tensor]]  # the loss, and the values logged (0-d device tensors)
Objective = Callable[..., Loss]  # caption_loss or scst.SelfCritical: (model, batch, config, encoded, totals, forward)


def clip_gradients(parameters: Iterable[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` to the bit, returning the total norm; where reading it is free
    (the CPU) its scaling by exactly 1 (a norm within `max_norm`, as most steps' are) is skipped, a pass
    over every gradient that changes none."""
    with_grads = [p for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm([p.grad for p in with_grads])  # ()
    if reads_are_free(total.device) and bool(max_norm / (total + 1e-6) >= 1.0):  # torch's coefficient, clamped to 1
        return total
    torch.nn.utils.clip_grads_with_norm_(with_grads, max_norm, total)
    return total


def caption_loss(model: Captioner, batch: CaptionBatch, config: Config, encoded: bool,
                 totals: tuple[int, ...] | None = None, forward: Callable[..., DecoderOutput] | None = None) -> Loss:
    """Cross-entropy of each next word plus the attention penalty, averaged over the global batch:
    `totals` = (target words, captions, images) summed over ranks (default: this batch's). Nothing is read
    back from the device (no boolean mask: its size would make the host wait). `forward` may be the DDP wrapper."""
    lengths = batch.lengths - 1  # (C,) input words per caption; on the CPU
    if bool((lengths[:-1] < lengths[1:]).any()):  # host tensor: no device sync; collate_captions sorts already
        lengths, order = lengths.sort(descending=True, stable=True)
        rows = order.to(batch.tokens.device, non_blocking=True)
        image_rows = rows if batch.image_rows is None else batch.image_rows[rows]  # (C,): each caption's image
        batch = replace(batch, tokens=batch.tokens[rows], image_rows=image_rows, lengths=batch.lengths[order])
    num_targets, num_captions = totals[:2] if totals is not None else (int(lengths.sum()), len(lengths))
    inputs, targets = batch.tokens[:, :-1], batch.tokens[:, 1:]  # (C, T) each
    out = (forward or model)(batch.images, inputs, batch.image_rows, encoded=encoded, lengths=lengths, packed=True)
    pad = model.vocab.pad_id
    if out.positions is None:  # (C, T, V): the padding is there, and ignored
        logits, target_words = out.logits.flatten(0, 1), targets.flatten()  # (C * T, V), (C * T,)
    else:  # the real positions alone: (M, V) and their targets (M,)
        logits, target_words = out.logits, targets.flatten().index_select(0, out.positions)
    xent = F.cross_entropy(logits.float(), target_words, ignore_index=pad, reduction="sum",
                           label_smoothing=config.train.label_smoothing) / num_targets
    penalty = model.decoder.attention_penalty(out.attn.float(), targets != pad) * (len(lengths) / num_captions)
    loss = xent + config.train.attention_penalty * penalty
    return loss, {"loss": loss.detach(), "xent": xent.detach(), "penalty": penalty.detach()}


def train_one_epoch(model: Captioner, forward: Callable[..., DecoderOutput], loader: DataLoader,
                    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler, config: Config,
                    ctx: Distributed, epoch: int, state: TrainState, on_step: Callable[[], None] | None = None,
                    objective: Objective = caption_loss, stop: StopSignals | None = None) -> None:
    """One epoch from the sampler's start position; a step reads nothing back from the device (the loss
    parts are read every `log_every` steps). `objective`: `caption_loss` or `scst.SelfCritical`. The epoch
    ends after a step that `stop` says every rank stops after."""
    model.train()
    device = ctx.device
    # the steps' precision, decided before the first one (training/speed.py) and never changed within a run
    amp = state.bf16 if state.bf16 is not None else device.type == "cuda" and config.train.amp
    channels_last = config.train.channels_last and device.type == "cuda" and not state.encoded
    bar = progress_bar(loader, desc=f"epoch {epoch}", unit="batch", leave=False, dynamic_ncols=True,
                       initial=state.position, total=len(loader), enabled=ctx.is_main)
    for batch in bar:
        state.position += 1
        if batch is None:  # every image of the batch failed to load
            if ctx.enabled:  # the other ranks would wait for this one's gradients forever
                raise DatasetError("every image of a batch failed to load; under torchrun a rank cannot skip a step "
                                   "(fix or remove the files the warnings name)")
            continue
        # target words, captions, images: CPU
        local = [int(batch.lengths.sum()) - len(batch.lengths), len(batch.lengths), len(batch.indices)]
        summed = ctx.sum_host(local + (stop.votes() if stop else []))  # over every rank, with the ranks' stop votes
        totals = tuple(summed[:3])  # what each rank's loss is a share of
        batch = batch.to(device, channels_last=channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss, parts = objective(model, batch, config, state.encoded, totals, forward)
        optimizer.zero_grad(set_to_none=True)
        (loss * ctx.world_size).backward()  # gradients are averaged over ranks; the loss is a share of the global mean
        if forward is model:  # no DDP wrapper saw this step (SCST, or one process): average here
            ctx.average_gradients(model.parameters())
        if config.train.grad_clip > 0:
            clip_gradients(model.parameters(), config.train.grad_clip)
        optimizer.step()
        scheduler.step()
        state.step += 1
        state.accumulate(torch.stack([parts[k] for k in state.logged]))  # (P,) on the device, not read here
        if config.train.log_every and state.step % config.train.log_every == 0:
            values = state.read_running(ctx)
            check_finite_loss(values["loss"], state.step, config)
            bar.set_postfix(loss=f"{values['loss']:.3f}", lr=f"{scheduler.get_last_lr()[0]:.1e}")
            log.debug("step %d loss %.4f", state.step, values["loss"])
            state.step_losses.append([state.step, values["loss"]])
            if state.writer is not None:
                for key, value in values.items():
                    state.writer.add_scalar(f"train/{key}", value, state.step)
        if on_step is not None:
            on_step()
        if stop is not None and stop.stop_after_step(summed[3:], ctx):
            break
    bar.close()
