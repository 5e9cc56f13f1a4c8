"""What a training run is built from, one step each, called in order by `Run.start` (training/fit.py): the data,
the objective, the loader, the learning rates (warmup and decay, the global-batch scaling rule, the optimiser's
groups) and the DDP wrapper."""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from captioner.core.config_sections import Config
from captioner.core.process_settings import loader_workers
from captioner.data.batching import CaptionDataset, EpochBatchSampler, collate_captions, device_preprocess, rank_batch
from captioner.data.image_transform import ImageTransform
from captioner.data.records import ImageRecord
from captioner.data.store_format import StoreRows, store_dir
from captioner.data.store_extract import make_store_folder, split_features
from captioner.data.shards import ShardSet
from captioner.data.streaming import ShardStream, StreamingCaptions, StreamSettings
from captioner.models.captioner import Captioner
from captioner.models.decoder import DecoderOutput
from captioner.text.vocab import Vocabulary
from captioner.training.distributed import Distributed
from captioner.training.loop import SIGNALS, Objective, caption_loss
from captioner.training.scst import SelfCritical
from captioner.training.speed import SpeedChoices, decide_steps, describe
from captioner.training.state import TrainState

log = logging.getLogger(__name__)

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


def make_scheduler(optimizer: torch.optim.Optimizer, config: Config,
                   steps_per_epoch: int) -> torch.optim.lr_scheduler.LambdaLR:
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
        encoder_lr = config.train.encoder_lr if config.model.encoder.pretrained else config.train.lr
        groups.append({"params": encoder_params, "lr": encoder_lr * scale})
    # fused: one kernel for all parameters (fp32 as before), several times faster than the loop over them on the CPU.
    return torch.optim.AdamW(groups, weight_decay=config.train.weight_decay, fused=True)


@dataclass
class RunData:
    """The images a run trains and validates on, with their stored rows on the store route
    (None on the images route) and the grid of the encoder's output (None: read off each batch)."""

    train_records: list[ImageRecord]
    val_records: list[ImageRecord]
    train_features: torch.Tensor | StoreRows | None = None
    val_features: torch.Tensor | StoreRows | None = None
    grid: tuple[int, int] | None = None


def uses_feature_store(config: Config, model: Captioner, shards: ShardSet | None) -> bool:
    """Train on the feature store: the encoder has frozen blocks, the images are not augmented,
    `train.cache_features` is on and the images are not streamed."""
    return model.encoder.storable and not config.data.augment and config.train.cache_features and shards is None


def stored_data(config: Config, ctx: Distributed, model: Captioner, train_records: list[ImageRecord],
                val_records: list[ImageRecord], all_val_records: list[ImageRecord]) -> RunData:
    """The train and val rows of the feature store: rank 0 builds the store when it is absent,
    then the other ranks open it."""
    if ctx.is_main:  # a store folder that cannot be made: one line, before the log line that names it
        make_store_folder(store_dir(config))
    encoder = model.encoder
    trained = "" if encoder.frozen else f" and the top {len(encoder.blocks) - encoder.num_frozen} encoder blocks"
    log.info("training the decoder%s on the feature store in %s (what the frozen blocks make, stored once)", trained,
             store_dir(config))
    if not ctx.is_main:
        ctx.barrier()
    train = split_features(model, config, "train", train_records, build=ctx.is_main)
    val = split_features(model, config, "val", all_val_records, use=val_records, build=ctx.is_main)
    if ctx.is_main:
        ctx.barrier()
    return RunData(train.records, val.records, train.features, val.features, train.grid)


def decide_speed(config: Config, ctx: Distributed, model: Captioner, state: TrainState, data: RunData,
                 checkpoint: dict | None, threads: int | None) -> SpeedChoices:
    """The steps' precision and products route, decided on synthetic work of the batch a step will take (or taken
    back from the checkpoint) before the first step; `threads`: the count `decide_threads` fixed."""
    saved = checkpoint["train_state"] if checkpoint is not None else None
    features = data.train_features  # (rows, N, D): feature_shape is a row's (N, D)
    feature_shape = tuple(features[0].shape) if state.encoded and features is not None and len(features) else None
    last = str(Path(config.train.out_dir) / "last.pt")
    # A streamed run's batches are full (its size unknown here); a dataset smaller than the global batch is shared
    batch = rank_batch(len(data.train_records), config.data.batch_size, ctx.world_size) if data.train_records else None
    state.bf16, onednn, gram_mm, grad_mm = decide_steps(config, ctx, model, state.encoded, feature_shape, saved, last,
                                                        batch)
    speed = SpeedChoices(state.bf16, threads, onednn, gram_mm, grad_mm)
    if ctx.is_main:
        log.debug("%s", describe(speed, ctx.device))
    return speed


def caption_dataset(config: Config, model: Captioner, data: RunData, device: torch.device) -> CaptionDataset:
    """The training pairs: one per caption for cross-entropy (up to `data.captions_per_image`),
    one per image for SCST, rewarded against all its references; their images augmented as `data.augment` says."""
    pairs = "all" if config.train.stage == "scst" else config.data.captions_per_image
    transform = ImageTransform(config.data.image_size, train=True, augment=config.data.augment)
    train_set = CaptionDataset(data.train_records, model.vocab, transform, config.data.max_caption_length, pairs,
                               data.train_features)
    train_set.device_preprocess = device_preprocess(config.data.device_preprocess, device)  # CaptionBatch.to runs it
    return train_set


def make_objective(config: Config, model: Captioner, train_set: CaptionDataset) -> Objective | SelfCritical:
    """Cross-entropy, or for the SCST stage the self-critical objective over the training
    images' references (its reward table saved once per node, mapped by every rank)."""
    if config.train.stage != "scst":
        return caption_loss
    references = [r.captions for r in train_set.records]
    return SelfCritical(config.scst, model.vocab, references, xent=caption_loss, cache_dir=Path(config.train.out_dir))


def make_loader(config: Config, ctx: Distributed, train_set: CaptionDataset, shards: ShardSet | None,
                vocab: Vocabulary) -> tuple[DataLoader | ShardStream, EpochBatchSampler | ShardStream]:
    """The training loader and what plans its epochs: a webdataset run's stream (captioner/data/streaming.py)
    is its own sampler. Rows already on the device are indexed in this process; otherwise workers read them."""
    data, device = config.data, ctx.device
    on_device = isinstance(train_set.features, torch.Tensor)
    workers = 0 if on_device else loader_workers(data.num_workers)  # -1: this rank's share of the node's cores
    if shards is not None:
        settings = StreamSettings(config.train.seed, ctx.rank, ctx.world_size, workers, data.batch_size,
                                  data.max_broken_fraction, data.shuffle_buffer, data.max_caption_length,
                                  data.captions_per_image)
        trace = os.environ.get("CAPTIONER_TRACE_SAMPLES")  # a folder: each rank writes the keys it trains on
        stream = ShardStream(StreamingCaptions(shards, vocab, train_set.transform, settings),
                             pin_memory=device.type == "cuda", worker_init_fn=ignore_stop_signals,
                             trace=Path(trace) / f"rank{ctx.rank}.txt" if trace else None)
        return stream, stream
    sampler = EpochBatchSampler(len(train_set), data.batch_size, config.train.seed, ctx.rank, ctx.world_size)
    loader = DataLoader(
        train_set, batch_sampler=sampler, num_workers=workers, collate_fn=collate_captions,
        pin_memory=device.type == "cuda" and not on_device, persistent_workers=workers > 0,
        worker_init_fn=ignore_stop_signals,  # a SIGTERM to the whole process group stops the run, not its loaders
        generator=torch.Generator().manual_seed(config.train.seed),  # worker seeds; the global RNG stays untouched
    )
    return loader, sampler


def log_batch_plan(config: Config, ctx: Distributed, sampler: EpochBatchSampler | ShardStream) -> None:
    if ctx.is_main:
        log.debug("%d process%s x batch %d = global batch %d; %d steps per epoch; %s", ctx.world_size,
                  "es" if ctx.enabled else "", config.data.batch_size, sampler.global_batch, len(sampler),
                  describe_schedule(config, sampler.global_batch, len(sampler)))


def wrap_for_ddp(model: Captioner, config: Config, ctx: Distributed) -> Callable[..., DecoderOutput]:
    """The model, or under torchrun its DDP wrapper. SCST samples step by step through the bare
    decoder: its gradients are averaged by hand, and it gets no wrapper."""
    if not ctx.enabled or config.train.stage == "scst":
        return model
    device_ids = [ctx.device] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=config.model.blind)


def ignore_stop_signals(worker_id: int) -> None:
    """A DataLoader worker leaves SIGTERM and SIGINT to the training process, which stops after
    its step and then ends its workers; killed by a signal, a worker would fail the run mid-step."""
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def accelerate(model: Captioner, config: Config, device: torch.device, encoded: bool) -> None:
    """`train.channels_last` and `train.compile`: CUDA options, ignored (and said so) on the CPU."""
    if device.type != "cuda":
        log.info("train.channels_last / train.compile are CUDA options: ignored on %s", device)
        return
    if config.train.channels_last and not encoded:
        model.encoder.to(memory_format=torch.channels_last)
    if config.train.compile:
        model.decoder.compile(dynamic=True)  # in place: parameter names (and checkpoints) stay as they are
