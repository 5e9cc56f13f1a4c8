"""Training: a plain `train_one_epoch` and `fit` (validation, checkpoints, resume, early stopping).

Validation decodes val images with the model's own greedy decoding and scores the captions
(BLEU/CIDEr-D); the best checkpoint is chosen by that score, never by teacher-forced loss.
"""

from __future__ import annotations

import csv
import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from tqdm import tqdm

from captioner.checkpoint import read_checkpoint, save_checkpoint
from captioner.config import Config, dump_config
from captioner.data import load_split
from captioner.data.batching import CaptionBatch, CaptionDataset, collate_captions
from captioner.data.images import ImageTransform
from captioner.errors import CheckpointError, ConfigError
from captioner.evaluate import caption_records, score_captions
from captioner.features import split_features, store_dir
from captioner.models import Captioner, build_model
from captioner.vocab import Vocabulary

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device: {name!r} asked for, but no CUDA GPU is available (use auto or cpu)")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"train.device: {name!r} is not a device (auto, cpu, cuda, cuda:N)") from None


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def caption_loss(
    model: Captioner, batch: CaptionBatch, config: Config, encoded: bool
) -> tuple[torch.Tensor, dict[str, float]]:
    """Cross-entropy of each next word given the previous ones, plus the attention penalty."""
    lengths, order = (batch.lengths - 1).sort(descending=True)  # (C,) inputs per caption, longest first
    tokens, image_rows = batch.tokens[order], batch.image_rows[order]
    inputs, targets = tokens[:, :-1], tokens[:, 1:]  # (C, T) each
    out = model(batch.images, inputs, image_rows, encoded=encoded, lengths=lengths)
    mask = targets != model.vocab.pad_id  # (C, T)
    xent = F.cross_entropy(
        out.logits[mask].float(), targets[mask], label_smoothing=config.train.label_smoothing
    )  # logits[mask]: (M, V)
    penalty = model.decoder.attention_penalty(out.attn.float(), mask)
    loss = xent + config.train.attention_penalty * penalty
    return loss, {"loss": loss.item(), "xent": xent.item(), "penalty": penalty.item()}


def train_one_epoch(
    model: Captioner,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    config: Config,
    device: torch.device,
    epoch: int,
    state: TrainState,
    on_step=None,
) -> float:
    model.train()
    use_amp = config.train.amp and device.type == "cuda"
    losses = []
    bar = tqdm(loader, desc=f"epoch {epoch}", unit="batch", leave=False, dynamic_ncols=True)
    for batch in bar:
        if batch is None:  # every image of the batch failed to load
            continue
        batch = batch.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
            loss, parts = caption_loss(model, batch, config, encoded=state.encoded)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.train.grad_clip)
        optimizer.step()
        scheduler.step()
        state.step += 1
        losses.append(parts["loss"])
        bar.set_postfix(loss=f"{parts['loss']:.3f}", lr=f"{scheduler.get_last_lr()[0]:.1e}")
        if state.writer is not None:
            for key, value in parts.items():
                state.writer.add_scalar(f"train/{key}", value, state.step)
        if config.train.log_every and state.step % config.train.log_every == 0:
            log.debug("step %d loss %.4f", state.step, parts["loss"])
            state.step_losses.append((state.step, float(np.mean(losses[-config.train.log_every :]))))
        if on_step is not None:
            on_step()
    return float(np.mean(losses)) if losses else float("nan")


@dataclass
class TrainState:
    epoch: int = 0
    step: int = 0
    best_score: float = -math.inf
    best_epoch: int = 0
    history: list[dict] = field(default_factory=list)
    step_losses: list[tuple[int, float]] = field(default_factory=list)
    encoded: bool = False
    writer: object | None = None


def make_scheduler(optimizer: torch.optim.Optimizer, config: Config, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = config.train.warmup_steps

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if config.train.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress))  # cosine to 5% of the peak

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def fit(config: Config, resume: bool = False) -> Path:
    """Train a model as `config` says; returns the path of the best checkpoint."""
    out_dir = Path(config.train.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(config.train.seed)
    device = resolve_device(config.train.device)
    data = config.data

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
    else:
        vocab = Vocabulary.build((c for r in train_records for c in r.captions), data.min_word_count)
    log.info(
        "%s: %d train images, %d val images, vocabulary %d words (min count %d)",
        data.dataset, len(train_records), len(val_records), len(vocab), data.min_word_count,
    )
    model = build_model(config, vocab).to(device)
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
    vocab.save(out_dir / "vocab.json")
    dump_config(config, out_dir / "config.yaml")

    state = TrainState()
    state.encoded = model.encoder.frozen and not data.augment and config.train.cache_features
    train_features = val_features = None
    grid = None
    if state.encoded:
        log.info("encoder is frozen: training the decoder on the feature store in %s", store_dir(config))
        stored = split_features(model, config, "train", train_records)
        train_records, train_features, grid = stored.records, stored.features, stored.grid
        stored = split_features(model, config, "val", all_val_records, use=val_records)
        val_records, val_features = stored.records, stored.features
    on_device = isinstance(train_features, torch.Tensor)  # a tensor on the device: indexed in this process

    transform = ImageTransform(data.image_size, train=True, augment=data.augment)
    train_set = CaptionDataset(train_records, vocab, transform, data.max_caption_length, data.captions_per_image, train_features)
    loader = DataLoader(
        train_set,
        batch_size=data.batch_size,
        shuffle=True,
        num_workers=0 if on_device else data.num_workers,
        collate_fn=collate_captions,
        drop_last=len(train_set) > data.batch_size,
        generator=torch.Generator().manual_seed(config.train.seed),
    )
    groups = [{"params": [p for p in model.decoder.parameters()], "lr": config.train.lr}]
    encoder_params = [p for p in model.encoder.parameters() if p.requires_grad]
    if encoder_params:
        # A gentler rate fine-tunes pretrained layers; an encoder learning from scratch needs the full one.
        encoder_lr = config.train.encoder_lr if config.model.encoder.pretrained else config.train.lr
        groups.append({"params": encoder_params, "lr": encoder_lr})
    optimizer = torch.optim.AdamW(groups, weight_decay=config.train.weight_decay)
    scheduler = make_scheduler(optimizer, config, config.train.epochs * max(1, len(loader)))
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        saved_state = checkpoint["train_state"]
        state.epoch, state.step = saved_state["epoch"], saved_state["step"]
        state.best_score, state.best_epoch = saved_state["best_score"], saved_state["best_epoch"]
        state.history = read_history(out_dir / "metrics.csv")
        log.info("resumed from %s at epoch %d, step %d", out_dir / "last.pt", state.epoch, state.step)

    from torch.utils.tensorboard import SummaryWriter

    state.writer = SummaryWriter(str(out_dir / "tensorboard"))
    metric = config.train.val_metric
    started = time.time()

    def save(name: str) -> None:
        save_checkpoint(
            out_dir / name,
            model,
            optimizer=optimizer.state_dict(),
            scheduler=scheduler.state_dict(),
            train_state={"epoch": state.epoch, "step": state.step, "best_score": state.best_score, "best_epoch": state.best_epoch},
        )

    def periodic_save() -> None:
        every = config.train.checkpoint_every_steps
        if every and state.step % every == 0:
            save("last.pt")

    try:
        for epoch in range(state.epoch + 1, config.train.epochs + 1):
            epoch_start = time.time()
            train_loss = train_one_epoch(model, loader, optimizer, scheduler, config, device, epoch, state, periodic_save)
            captions = caption_records(
                model, val_records, beam_size=1, features=val_features, grid=grid, num_workers=data.num_workers, progress=False
            )
            scores = score_captions(val_records, captions)
            state.epoch = epoch
            improved = scores[metric] > state.best_score
            if improved:
                state.best_score, state.best_epoch = scores[metric], epoch
            row = {"epoch": epoch, "step": state.step, "train_loss": round(train_loss, 5), "lr": scheduler.get_last_lr()[0]}
            row |= {f"val_{k}": round(v, 5) for k, v in scores.items()}
            row["seconds"] = round(time.time() - epoch_start, 1)
            state.history.append(row)
            write_history(out_dir / "metrics.csv", state.history)
            for key, value in scores.items():
                state.writer.add_scalar(f"val/{key}", value, state.step)
            example = next(iter(captions.values())).text if captions else ""
            log.info(
                "epoch %d/%d  loss %.3f  val %s %.4f  CIDEr-D %.3f%s  (%.0fs)  e.g. %r",
                epoch, config.train.epochs, train_loss, metric, scores[metric], scores["CIDEr"],
                "  *best*" if improved else "", row["seconds"], example,
            )
            if improved:
                save("best.pt")
            save("last.pt")
            patience = config.train.early_stopping_patience
            if patience and epoch - state.best_epoch >= patience:
                log.info("early stopping: no better val %s for %d epochs", metric, patience)
                break
            limit = config.train.time_limit_minutes
            if limit and time.time() - started > limit * 60:
                log.info("stopping: the time limit of %.1f minutes is spent", limit)
                break
    finally:
        state.writer.close()
    plot_training(out_dir / "metrics.csv", state.step_losses, out_dir / "training_curves.png", metric)
    log.info("best val %s %.4f at epoch %d: %s", metric, state.best_score, state.best_epoch, out_dir / "best.pt")
    return out_dir / "best.pt"


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


def plot_training(csv_path: Path, step_losses: list[tuple[int, float]], out: Path, metric: str) -> None:
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
    ax_loss.plot([r["step"] for r in history], [r["train_loss"] for r in history], "o-", label="epoch mean")
    ax_loss.set(xlabel="step", ylabel="training loss", title="training loss")
    ax_loss.legend()
    for key in ("val_Bleu_1", "val_Bleu_4", "val_CIDEr"):
        if key in history[0]:
            ax_val.plot([r["epoch"] for r in history], [r[key] for r in history], "o-", label=key[4:])
    ax_val.set(xlabel="epoch", ylabel="score", title=f"validation (greedy decoding); best by {metric}")
    ax_val.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
