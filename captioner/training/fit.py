"""Training: a plain `train_one_epoch` and `fit` (validation, checkpoints, resume, early stopping).

Validation decodes val images with the model's own greedy decoding and scores the captions
(BLEU/CIDEr-D); the best checkpoint is chosen by that score, never by teacher-forced loss.
Under torchrun the same code runs on every rank (see `captioner.training.distributed`); last.pt holds
what an exact resume needs (position in the epoch, running sums, every RNG state).
"""

from __future__ import annotations

import csv
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioner.core.config import Config, dump_config
from captioner.core.errors import CheckpointError, ConfigError, DatasetError
from captioner.core.runtime import loader_workers, resolve_device, seed_everything
from captioner.data.batching import CaptionBatch, CaptionDataset, collate_captions
from captioner.data.datasets import load_split
from captioner.data.device_decode import device_preprocess
from captioner.data.images import ImageTransform
from captioner.data.records import ImageRecord
from captioner.data.sampler import EpochBatchSampler
from captioner.data.store import StoreRows, split_features, store_dir
from captioner.evaluation.evaluate import caption_records, references_for
from captioner.evaluation.metrics import fast_scores
from captioner.models.build import build_model
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import read_checkpoint, save_checkpoint
from captioner.models.decoder import DecoderOutput
from captioner.text.vocab import Vocabulary
from captioner.training import distributed
from captioner.training.distributed import Distributed
from captioner.training.resume import rng_state, set_rng_state
from captioner.training.scst import SelfCritical

log = logging.getLogger(__name__)


def caption_loss(
    model: Captioner,
    batch: CaptionBatch,
    config: Config,
    encoded: bool,
    totals: tuple[int, ...] | None = None,
    forward: Callable[..., DecoderOutput] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Cross-entropy of each next word given the previous ones, plus the attention penalty.

    Both are averages over the global batch: `totals` = (target words, captions, images) summed
    over every rank (default: this batch's), so that under DDP, where gradients are averaged over
    ranks, `loss * world_size` gives each rank its exact share of the global batch's mean.
    Nothing here reads a value back from the device: the lengths are a CPU tensor, the
    padding is skipped with `ignore_index` (not a boolean mask, whose size the host would wait
    for), and the parts come back as detached tensors, read only when they are logged.
    `forward` is the module to call (the DDP wrapper), `model` the one it wraps.
    """
    lengths = batch.lengths - 1  # (C,) input words per caption; on the CPU
    if bool((lengths[:-1] < lengths[1:]).any()):  # host tensor: no device sync; collate_captions sorts already
        lengths, order = lengths.sort(descending=True, stable=True)
        rows = order.to(batch.tokens.device, non_blocking=True)
        batch = replace(batch, tokens=batch.tokens[rows], image_rows=batch.image_rows[rows], lengths=batch.lengths[order])
    num_targets, num_captions = totals[:2] if totals is not None else (int(lengths.sum()), len(lengths))
    inputs, targets = batch.tokens[:, :-1], batch.tokens[:, 1:]  # (C, T) each
    out = (forward or model)(batch.images, inputs, batch.image_rows, encoded=encoded, lengths=lengths)
    pad = model.vocab.pad_id
    xent_sum = F.cross_entropy(
        out.logits.flatten(0, 1).float(),  # (C * T, V)
        targets.flatten(),  # (C * T,)
        ignore_index=pad,
        reduction="sum",
        label_smoothing=config.train.label_smoothing,
    )
    xent = xent_sum / num_targets
    penalty = model.decoder.attention_penalty(out.attn.float(), targets != pad) * (len(lengths) / num_captions)
    loss = xent + config.train.attention_penalty * penalty
    return loss, {"loss": loss.detach(), "xent": xent.detach(), "penalty": penalty.detach()}


LOGGED = ("loss", "xent", "penalty")  # cross-entropy's logged values; an objective may name its own (`logged`)


def train_one_epoch(
    model: Captioner,
    forward: Callable[..., DecoderOutput],
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    config: Config,
    ctx: Distributed,
    epoch: int,
    state: TrainState,
    on_step: Callable[[], None] | None = None,
    objective: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]] = caption_loss,
) -> None:
    """One epoch from the sampler's start position. A step reads nothing back from the device:
    the loss parts add up in device tensors, summed over ranks and read every `log_every`
    steps and at the end of the epoch. `objective` is the stage's loss: `caption_loss`, or
    `scst.SelfCritical` (whose logged values are `state.logged`)."""
    model.train()
    device = ctx.device
    use_amp = config.train.amp and device.type == "cuda"
    channels_last = config.train.channels_last and device.type == "cuda" and not state.encoded
    bar = tqdm(loader, desc=f"epoch {epoch}", unit="batch", leave=False, dynamic_ncols=True, initial=state.position,
               total=len(loader), disable=not ctx.is_main)
    for batch in bar:
        state.position += 1
        if batch is None:  # every image of the batch failed to load
            if ctx.enabled:  # the other ranks would wait for this one's gradients forever
                raise DatasetError("every image of a batch failed to load; under torchrun a rank cannot skip a step (fix or remove the files the warnings name)")
            continue
        local = [int(batch.lengths.sum()) - len(batch.lengths), len(batch.lengths), len(batch.indices)]  # target words, captions, images: CPU
        totals = tuple(ctx.sum_host(local))  # over every rank: what each rank's loss is a share of
        batch = batch.to(device, channels_last=channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
            loss, parts = objective(model, batch, config, state.encoded, totals, forward)
        optimizer.zero_grad(set_to_none=True)
        (loss * ctx.world_size).backward()  # gradients are averaged over ranks; the loss is a share of the global mean
        if ctx.enabled and forward is model:  # no DDP wrapper saw this step (SCST): average here
            ctx.average_gradients(model.parameters())
        if config.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.train.grad_clip)
        optimizer.step()
        scheduler.step()
        state.step += 1
        state.accumulate(torch.stack([parts[k] for k in state.logged]))  # (P,) on the device, not read here
        if config.train.log_every and state.step % config.train.log_every == 0:
            values = state.read_running(ctx)
            bar.set_postfix(loss=f"{values['loss']:.3f}", lr=f"{scheduler.get_last_lr()[0]:.1e}")
            log.debug("step %d loss %.4f", state.step, values["loss"])
            state.step_losses.append([state.step, values["loss"]])
            if state.writer is not None:
                for key, value in values.items():
                    state.writer.add_scalar(f"train/{key}", value, state.step)
        if on_step is not None:
            on_step()
    bar.close()


@dataclass
class TrainState:
    """Where training stands; all of it goes into last.pt so that a resumed run continues
    exactly (the position in the epoch, the running loss sums, the history of epochs)."""

    epoch: int = 0  # epochs completed
    position: int = 0  # batches of epoch `epoch + 1` already trained
    step: int = 0
    best_score: float = -math.inf
    best_epoch: int = 0  # the epoch best.pt was validated in (0: an SCST stage's starting model)
    best_step: int = 0  # and the step (mid-epoch with train.val_every_steps)
    history: list[dict] = field(default_factory=list)
    step_losses: list[list] = field(default_factory=list)  # [step, mean loss since the last log]
    # Device sums of the objective's logged values (`logged`: loss first), read only when logged:
    # since the last log, and over the epoch.
    logged: tuple[str, ...] = LOGGED
    running: torch.Tensor | None = None  # (P,)
    running_steps: int = 0
    epoch_sums: torch.Tensor | None = None  # (P,)
    epoch_steps: int = 0
    encoded: bool = False
    writer: object | None = None

    def reset_sums(self, device: torch.device) -> None:
        self.running = torch.zeros(len(self.logged), device=device)  # (P,)
        self.epoch_sums = torch.zeros(len(self.logged), device=device)  # (P,)
        self.running_steps = self.epoch_steps = 0

    def accumulate(self, parts: torch.Tensor) -> None:
        assert self.running is not None and self.epoch_sums is not None
        self.running += parts
        self.epoch_sums += parts
        self.running_steps += 1
        self.epoch_steps += 1

    def read_running(self, ctx: Distributed) -> dict[str, float]:
        """The mean of each logged value per step since the last read, over all ranks (one sync)."""
        assert self.running is not None
        sums = ctx.sum_(self.running.clone()).tolist()
        values = {k: v / max(1, self.running_steps) for k, v in zip(self.logged, sums)}
        self.running.zero_()
        self.running_steps = 0
        return values

    def read_epoch_means(self, ctx: Distributed) -> dict[str, float]:
        """The epoch's mean of each logged value per step, over all ranks (one sync)."""
        assert self.epoch_sums is not None
        if not self.epoch_steps:
            return {k: float("nan") for k in self.logged}
        sums = ctx.sum_(self.epoch_sums.clone()).tolist()
        return {k: v / self.epoch_steps for k, v in zip(self.logged, sums)}

    def to_dict(self) -> dict:
        """Plain data (tensors, numbers, lists) for a weights_only checkpoint."""
        return {
            "epoch": self.epoch, "position": self.position, "step": self.step,
            "best_score": self.best_score, "best_epoch": self.best_epoch, "best_step": self.best_step,
            "history": self.history, "step_losses": self.step_losses,
            "running": self.running.cpu() if self.running is not None else None, "running_steps": self.running_steps,
            "epoch_sums": self.epoch_sums.cpu() if self.epoch_sums is not None else None, "epoch_steps": self.epoch_steps,
        }

    def load(self, saved: dict, device: torch.device) -> None:
        self.epoch, self.step = saved["epoch"], saved["step"]
        self.position = saved.get("position", 0)
        self.best_score, self.best_epoch = saved["best_score"], saved["best_epoch"]
        self.history = list(saved.get("history", []))
        # Checkpoints from before best_step validated at epoch ends only: the best epoch's row has it.
        self.best_step = saved.get("best_step", next((r["step"] for r in self.history if r["epoch"] == self.best_epoch), 0))
        self.step_losses = list(saved.get("step_losses", []))
        self.reset_sums(device)
        if saved.get("running") is not None and self.position:  # mid-epoch: the sums go on
            self.running.copy_(saved["running"])
            self.epoch_sums.copy_(saved["epoch_sums"])
            self.running_steps, self.epoch_steps = saved["running_steps"], saved["epoch_steps"]


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


def make_scheduler(optimizer: torch.optim.Optimizer, config: Config, steps_per_epoch: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, then cosine decay to 5% of the peak at the last step (or constant).

    The factor of optimiser step `step` (0-based) depends only on the epochs done after it,
    (step + 1) / steps_per_epoch, when the warmup is given in epochs: the schedule is then the
    same function of epochs on 1 and 8 processes, whose epochs have 8x fewer steps."""
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


def fit(config: Config, resume: bool = False) -> Path:
    """Train a model as `config` says; returns the path of the best checkpoint.

    Under torchrun every process runs this; rank 0 alone writes files. `data.batch_size` is per
    process: the global batch is batch_size x world size, and the learning rate is used as
    configured (never scaled behind the user's back).
    """
    out_dir = Path(config.train.out_dir)
    ctx = distributed.setup(resolve_device(config.train.device, "train.device"), config.train.dist_timeout_minutes)
    device = ctx.device
    if ctx.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(config.train.seed)
    data = config.data

    if ctx.is_main:  # the shapes world is generated on first use: once, before the others read it
        train_records = load_split(data, "train")
    ctx.barrier()
    if not ctx.is_main:
        train_records = load_split(data, "train")
    val_records = all_val_records = load_split(data, "val")  # the store holds the whole split
    if config.train.val_max_images:
        val_records = val_records[: config.train.val_max_images]

    checkpoint = None
    if resume:
        last = out_dir / "last.pt"
        if not last.exists():
            raise CheckpointError(f"{last}: nothing to resume (no last.pt in train.out_dir)")
        checkpoint = read_checkpoint(last)
        saved = checkpoint["config"]
        if saved["model"] != config.to_dict()["model"]:
            raise CheckpointError(f"{last}: the model section of the config differs from the checkpoint's; cannot resume")
        vocab = Vocabulary(checkpoint["vocab"])
    elif config.train.init:
        initial = read_init_checkpoint(config)
        vocab = Vocabulary(initial["vocab"])
    else:
        if config.train.stage == "scst":
            raise ConfigError("train.stage: scst starts from a cross-entropy model: set train.init (or pass --init CHECKPOINT)")
        vocab = Vocabulary.build((c for r in train_records for c in r.captions), data.min_word_count)
    log.info(
        "%s: %d train images, %d val images, vocabulary %d words (min count %d)",
        data.dataset, len(train_records), len(val_records), len(vocab), data.min_word_count,
    )
    model = build_model(config, vocab, load_pretrained=checkpoint is None and not config.train.init).to(device)
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
    elif config.train.init:
        model.load_state_dict(initial["model"])  # the encoder too: fine-tuned layers stay fine-tuned
    if ctx.is_main:
        vocab.save(out_dir / "vocab.json")
        dump_config(config, out_dir / "config.yaml")

    state = TrainState()
    state.encoded = model.encoder.frozen and not data.augment and config.train.cache_features
    train_features = val_features = None
    grid = None
    if state.encoded:
        log.info("encoder is frozen: training the decoder on the feature store in %s", store_dir(config))
        if not ctx.is_main:
            ctx.barrier()  # rank 0 builds the store when it is absent; then the others open it
        stored = split_features(model, config, "train", train_records, build=ctx.is_main)
        train_records, train_features, grid = stored.records, stored.features, stored.grid
        stored = split_features(model, config, "val", all_val_records, use=val_records, build=ctx.is_main)
        val_records, val_features = stored.records, stored.features
        if ctx.is_main:
            ctx.barrier()
    on_device = isinstance(train_features, torch.Tensor)  # a tensor on the device: indexed in this process
    if config.train.channels_last or config.train.compile:
        accelerate(model, config, device, state.encoded)

    transform = ImageTransform(data.image_size, train=True, augment=data.augment)
    scst = config.train.stage == "scst"
    pairs = "all" if scst else data.captions_per_image  # SCST: one item per image, rewarded against all its references
    train_set = CaptionDataset(train_records, vocab, transform, data.max_caption_length, pairs, train_features)
    objective = SelfCritical(config.scst, vocab, [r.captions for r in train_set.records], xent=caption_loss, cache_dir=out_dir) if scst else caption_loss  # the reward table: saved once per node, mapped by every rank
    state.logged = objective.logged if scst else LOGGED
    sampler = EpochBatchSampler(len(train_set), data.batch_size, config.train.seed, ctx.rank, ctx.world_size)
    workers = 0 if on_device else loader_workers(data.num_workers)  # -1: this rank's share of the node's cores
    train_set.device_preprocess = device_preprocess(data.device_preprocess, device)  # CaptionBatch.to runs it there
    loader = DataLoader(
        train_set,
        batch_sampler=sampler,
        num_workers=workers,
        collate_fn=collate_captions,
        pin_memory=device.type == "cuda" and not on_device,
        persistent_workers=workers > 0,
        generator=torch.Generator().manual_seed(config.train.seed),  # worker seeds; the global RNG stays untouched
    )
    if ctx.is_main:
        log.info(
            "%d process%s x batch %d = global batch %d; %d steps per epoch; %s",
            ctx.world_size, "es" if ctx.enabled else "", data.batch_size, sampler.global_batch, len(sampler),
            describe_schedule(config, sampler.global_batch, len(sampler)),
        )
    scale = lr_scale(config, sampler.global_batch)
    groups = [{"params": [p for p in model.decoder.parameters()], "lr": config.train.lr * scale}]
    encoder_params = [p for p in model.encoder.parameters() if p.requires_grad]
    if encoder_params:
        # A gentler rate fine-tunes pretrained layers; an encoder learning from scratch needs the full one.
        encoder_lr = config.train.encoder_lr if config.model.encoder.pretrained else config.train.lr
        groups.append({"params": encoder_params, "lr": encoder_lr * scale})
    optimizer = torch.optim.AdamW(groups, weight_decay=config.train.weight_decay)
    scheduler = make_scheduler(optimizer, config, len(sampler))
    forward: Callable[..., DecoderOutput] = model
    if ctx.enabled and not scst:  # SCST samples step by step through the bare decoder: its gradients are averaged by hand
        forward = DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None, find_unused_parameters=config.model.blind
        )
    state.reset_sums(device)
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        state.load(checkpoint["train_state"], device)
        if state.position > len(sampler):
            raise CheckpointError(f"{out_dir / 'last.pt'}: saved at batch {state.position} of an epoch of {len(sampler)}; the data or batch size changed")
        restore_rng(checkpoint["train_state"], ctx, config.train.seed, state)
        log.info("resumed from %s at epoch %d, batch %d, step %d", out_dir / "last.pt", state.epoch + 1, state.position, state.step)
    elif ctx.enabled:  # the same initial weights everywhere, then each rank its own dropout masks
        seed_everything(config.train.seed + ctx.rank)

    if ctx.is_main:
        from torch.utils.tensorboard import SummaryWriter

        # A resumed run drops the events the killed run logged after its checkpoint.
        state.writer = SummaryWriter(str(out_dir / "tensorboard"), purge_step=state.step + 1 if checkpoint else None)
        if checkpoint is not None:
            write_history(out_dir / "metrics.csv", state.history)  # rows logged after the checkpoint go
    metric = config.train.val_metric
    started = time.time()

    def save(name: str) -> None:
        """Every rank calls this (it gathers their RNG states); rank 0 writes."""
        rng = ctx.all_gather(rng_state())
        if ctx.is_main:
            save_checkpoint(
                out_dir / name,
                model,
                config,
                optimizer=optimizer.state_dict(),
                scheduler=scheduler.state_dict(),
                train_state={**state.to_dict(), "world_size": ctx.world_size, "rng": rng},
            )

    def check(epoch: int, row: dict, label: str, since: float) -> None:
        """Validate; log `row` with the scores and the seconds since `since` into the history;
        keep best.pt. Every rank calls it."""
        scores, example = validate(model, ctx, val_records, val_features, grid, data.num_workers, config.train.val_beam_size)
        improved = scores[metric] > state.best_score
        if improved:
            state.best_score, state.best_epoch, state.best_step = scores[metric], epoch, state.step
        row |= {f"val_{k}": round(v, 5) for k, v in scores.items()} | {"seconds": round(time.time() - since, 1)}
        state.history.append(row)
        if ctx.is_main:
            for key, value in scores.items():
                state.writer.add_scalar(f"val/{key}", value, state.step)
            log.info(
                "%s  val %s %.4f  CIDEr-D %.3f%s  (%.0fs)  e.g. %r",
                label, metric, scores[metric], scores["CIDEr"], "  *best*" if improved else "", row["seconds"], example,
            )
        if improved:
            save("best.pt")

    def keep_progress() -> None:
        """last.pt and metrics.csv after a validation: a resumed run starts from what best.pt and the history say."""
        save("last.pt")
        if ctx.is_main:
            write_history(out_dir / "metrics.csv", state.history)

    def on_step() -> None:
        every = config.train.val_every_steps
        if every and state.step % every == 0 and state.position < len(loader):  # the epoch's end validates anyway
            epoch = state.epoch + 1
            done = round(state.epoch + state.position / len(loader), 4)  # epochs trained, with the fraction of this one
            check(epoch, {"epoch": epoch, "step": state.step, "epochs_done": done}, f"epoch {epoch}, step {state.step}", time.time())
            model.train()  # validation decoded in eval mode
            keep_progress()
        elif config.train.checkpoint_every_steps and state.step % config.train.checkpoint_every_steps == 0:
            save("last.pt")

    try:
        if scst and checkpoint is None:
            # The starting model is the first candidate, so SCST's best.pt is never worse on val
            # than its init, and the log shows where the stage starts from.
            check(0, {"epoch": 0, "step": 0}, f"start ({config.train.init})", time.time())
        for epoch in range(state.epoch + 1, config.train.epochs + 1):
            epoch_start = time.time()
            if state.position == 0:
                state.reset_sums(device)
            sampler.set_epoch(epoch, start=state.position)
            train_one_epoch(model, forward, loader, optimizer, scheduler, config, ctx, epoch, state, on_step, objective)
            means = state.read_epoch_means(ctx)
            state.epoch, state.position = epoch, 0
            row = {"epoch": epoch, "step": state.step, "train_loss": round(means["loss"], 5), "lr": scheduler.get_last_lr()[0]}
            row |= {f"train_{k}": round(v, 5) for k, v in means.items() if k != "loss"}
            check(epoch, row, f"epoch {epoch}/{config.train.epochs}  loss {means['loss']:.3f}", epoch_start)
            keep_progress()
            if ctx.broadcast(should_stop(config, state, epoch, started) if ctx.is_main else None):
                break
    finally:
        if state.writer is not None:
            state.writer.close()
    if ctx.is_main:
        plot_training(out_dir / "metrics.csv", state.step_losses, out_dir / "training_curves.png", metric, config.train.val_beam_size)
        log.info("best val %s %.4f at epoch %d, step %d: %s", metric, state.best_score, state.best_epoch, state.best_step, out_dir / "best.pt")
    distributed.shutdown(ctx)
    return out_dir / "best.pt"


TRAINING_CHOICES = ("model.encoder.fine_tune_blocks",)  # how a stage trains the model, not what the model is


def read_init_checkpoint(config: Config) -> dict:
    """The checkpoint `train.init` names, whose model section must be the config's, except for
    the TRAINING_CHOICES: a stage may fine-tune an encoder that the previous one kept frozen
    (a model trained on the feature store), or freeze one it fine-tuned. The weights fit either way."""
    path = config.train.init
    checkpoint = read_checkpoint(path)
    saved, current = checkpoint["config"].get("model", {}), config.to_dict()["model"]
    for dotted in TRAINING_CHOICES:
        was, now = dotted_value(saved, dotted), dotted_value(current, dotted)
        if was != now:
            log.info("%s: %s is %r in the checkpoint, %r here: this stage trains as its config says", path, dotted, was, now)
    conflict = first_difference(saved, current, "model", skip=TRAINING_CHOICES)
    if conflict:
        raise CheckpointError(f"{path}: {conflict}; train.init needs the model section the checkpoint was trained with")
    return checkpoint


def dotted_value(section: dict, dotted: str) -> object:
    """`section`'s value at `dotted` ('model.encoder.x' in a model section), None where absent."""
    value: object = section
    for part in dotted.split(".")[1:]:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def first_difference(saved: object, current: object, key: str, skip: tuple[str, ...] = ()) -> str | None:
    """'model.x.y is A in the checkpoint but B in the config' for the first differing key not in `skip`, or None."""
    if key in skip:
        return None
    if isinstance(saved, dict) and isinstance(current, dict):
        for name in list(dict.fromkeys([*saved, *current])):
            found = first_difference(saved.get(name), current.get(name), f"{key}.{name}", skip)
            if found:
                return found
        return None
    return None if saved == current else f"{key} is {saved!r} in the checkpoint but {current!r} in the config"


def validate(
    model: Captioner,
    ctx: Distributed,
    records: list[ImageRecord],
    features: torch.Tensor | StoreRows | None,
    grid: tuple[int, int] | None,
    num_workers: int,
    beam_size: int = 1,
) -> tuple[dict[str, float], str]:
    """Greedy (or beam) captions of the val images, each rank its share, scored on the gathered
    whole (every rank gets the same scores); returns the scores and one example caption."""
    mine = ctx.shard(list(range(len(records))))
    captions = caption_records(
        model, [records[i] for i in mine], beam_size=beam_size, features=None if features is None else features[mine],
        grid=grid, num_workers=num_workers, progress=False,
    )
    texts = {image_id: c.text for image_id, c in captions.items()}
    merged = {k: v for part in ctx.all_gather(texts) for k, v in part.items()}
    return fast_scores(references_for(records, merged), merged), next(iter(merged.values()), "")


def should_stop(config: Config, state: TrainState, epoch: int, started: float) -> bool:
    patience = config.train.early_stopping_patience
    if patience and epoch - state.best_epoch >= patience:
        log.info("early stopping: no better val %s for %d epochs", config.train.val_metric, patience)
        return True
    limit = config.train.time_limit_minutes
    if limit and time.time() - started > limit * 60:
        log.info("stopping: the time limit of %.1f minutes is spent", limit)
        return True
    return False


def restore_rng(saved: dict, ctx: Distributed, seed: int, state: TrainState) -> None:
    """Put back this rank's generators as they were at the checkpoint. A checkpoint from
    another number of processes can only go on at an epoch boundary, with fresh streams."""
    states = saved.get("rng")
    if states is not None and len(states) == ctx.world_size:
        set_rng_state(states[ctx.rank])
        return
    if state.position:
        raise CheckpointError(
            f"{saved.get('world_size', '?')} processes wrote this mid-epoch checkpoint; resume it with as many "
            f"(this run has {ctx.world_size}), or from an end-of-epoch checkpoint"
        )
    log.warning("the checkpoint holds no random states for %d processes: resuming with fresh ones (not bit-exact)", ctx.world_size)
    seed_everything(seed + 1000 * state.epoch + ctx.rank)


def accelerate(model: Captioner, config: Config, device: torch.device, encoded: bool) -> None:
    """`train.channels_last` and `train.compile`: CUDA options, ignored (and said so) on the CPU."""
    if device.type != "cuda":
        log.info("train.channels_last / train.compile are CUDA options: ignored on %s", device)
        return
    if config.train.channels_last and not encoded:
        model.encoder.to(memory_format=torch.channels_last)
    if config.train.compile:
        model.decoder.compile(dynamic=True)  # in place: parameter names (and checkpoints) stay as they are


def write_history(path: Path, history: list[dict]) -> None:
    keys = list(dict.fromkeys(k for row in history for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(history)


def read_history(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
    for row in rows:
        row["epoch"], row["step"] = int(row["epoch"]), int(row["step"])
    return rows


def epochs_trained(row: dict) -> float:
    """Where a history row sits on an epoch axis: mid-epoch validations (train.val_every_steps)
    at their fraction, `epochs_done`; the others at their epoch."""
    return row.get("epochs_done", row["epoch"])


def plot_training(csv_path: Path, step_losses: list[tuple[int, float]], out: Path, metric: str, beam_size: int = 1) -> None:
    """Training loss per epoch (and per logged step) beside the validation scores."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = read_history(csv_path)
    if not history:
        return
    fig, (ax_loss, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
    if step_losses:
        ax_loss.plot([s for s, _ in step_losses], [v for _, v in step_losses], alpha=0.5, label="per logged step")
    trained = [r for r in history if "train_loss" in r]  # an SCST stage's epoch 0 is validation only
    ax_loss.plot([r["step"] for r in trained], [r["train_loss"] for r in trained], "o-", label="epoch mean")
    ax_loss.set(xlabel="step", ylabel="training loss", title="training loss")
    ax_loss.legend()
    for key in ("val_Bleu_1", "val_Bleu_4", "val_CIDEr"):
        if key in history[0]:
            ax_val.plot([epochs_trained(r) for r in history], [r[key] for r in history], "o-", label=key[4:])
    decoding = "greedy decoding" if beam_size == 1 else f"beam {beam_size}"
    ax_val.set(xlabel="epoch", ylabel="score", title=f"validation ({decoding}); best by {metric}")
    ax_val.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
