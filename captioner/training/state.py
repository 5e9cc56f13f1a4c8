"""Where a run starts (a stage's `train.init` checkpoint, or the last.pt a `--resume` continues) and where it
stands: `TrainState` and the random number generators' states, kept in last.pt for an exact resume. The generator
states are tensors, lists and ints only, so that last.pt still loads with `torch.load(weights_only=True)`."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from captioner.core.config_sections import Config
from captioner.core.errors import CaptionerError, CheckpointError, DivergedError
from captioner.core.portable_config import value_at
from captioner.core.process_settings import seed_everything
from captioner.data.records import ImageRecord, is_int, is_number
from captioner.data.shards import ShardSet
from captioner.models.checkpoint import read_checkpoint
from captioner.training.distributed import Distributed
from captioner.training.run_folders import require_resumable

log = logging.getLogger(__name__)

LOGGED = ("loss", "xent", "penalty")  # cross-entropy's logged values; an objective may name its own (`logged`)
# what last.pt keeps of a TrainState (`to_dict`; `load` reads them back)
SAVED = ("epoch", "position", "step", "best_score", "best_epoch", "best_step", "history", "step_losses", "running",
         "running_steps", "epoch_sums", "epoch_steps")


def check_finite_loss(loss: float, step: int, config: Config) -> None:
    """Stop at the first logged loss that is not a finite number: every later step would train NaN weights to the
    end and exit as if well. The same summed value on every rank, so every rank stops at the same step."""
    if not math.isfinite(loss):
        clip = f"train.grad_clip (now {config.train.grad_clip:g})" if config.train.grad_clip > 0 else "train.grad_clip"
        raise DivergedError(f"the training loss is {loss} by step {step}: the weights diverged; lower train.lr (now "
                            f"{config.train.lr:g}) or set {clip}; nothing of these steps is saved (a checkpoint in "
                            f"{config.train.out_dir} is from before)")


@dataclass
class TrainState:
    """Where training stands; all of it goes into last.pt so that a resumed run continues exactly."""

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
    bf16: bool | None = None  # bf16 autocast steps, as training/speed.py decided; None: train.amp on CUDA, fp32 on CPU
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
        saved = {name: getattr(self, name) for name in SAVED}
        return saved | {name: saved[name].cpu() for name in ("running", "epoch_sums") if saved[name] is not None}

    def load(self, saved: dict, device: torch.device, source: str = "last.pt") -> None:
        """Where a checkpoint's train state `saved` stands (`check_train_state` checked its fields); mid-epoch, the
        sums of the objective's logged values too, which must be as many as this run's (`source` names the file)."""
        self.epoch, self.step = saved["epoch"], saved["step"]
        self.position = saved.get("position", 0)
        self.best_score, self.best_epoch = saved["best_score"], saved["best_epoch"]
        self.history = list(saved.get("history", []))
        # Checkpoints from before best_step validated at epoch ends only: the best epoch's row has it.
        best_rows = (r["step"] for r in self.history if r["epoch"] == self.best_epoch)
        self.best_step = saved.get("best_step", next(best_rows, 0))
        self.step_losses = list(saved.get("step_losses", []))
        self.reset_sums(device)
        if saved.get("running") is not None and self.position:  # mid-epoch: the sums go on
            for key in ("running", "epoch_sums"):
                if getattr(saved.get(key), "shape", None) != self.running.shape:
                    raise CheckpointError(f"{source}: train_state.{key} holds {str(saved.get(key))[:80]}, where "
                                          f"this run sums {len(self.logged)} values ({', '.join(self.logged)})")
            self.running.copy_(saved["running"])
            self.epoch_sums.copy_(saved["epoch_sums"])
            self.running_steps, self.epoch_steps = saved["running_steps"], saved["epoch_steps"]


# last.pt's train_state fields of whole numbers, 0 or more: those every last.pt has, then those an older one may lack
COUNTS = ("epoch", "step", "best_epoch")
OPTIONAL_COUNTS = ("position", "best_step", "running_steps", "epoch_steps")


def check_train_state(checkpoint: dict, path: Path) -> None:
    """Refuse, in one line naming `path` and the field, a last.pt that --resume cannot go on from: no train_state,
    optimizer or scheduler state (a model's checkpoint, or a damaged one), or a train_state field of the wrong
    type or out of range. Checked before the run writes anything into its folder."""
    saved = checkpoint.get("train_state")
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path}: no train_state (a model's checkpoint, not a run's last.pt): --resume "
                              "continues a run from the last.pt its training wrote")
    for key in ("optimizer", "scheduler"):
        if not isinstance(checkpoint.get(key), dict):
            raise CheckpointError(f"{path}: no {key} state (a damaged last.pt): --resume cannot go on from it; "
                                  "train.init starts a new run from its model")
    problem = train_state_problem(saved)
    if problem is not None:
        raise CheckpointError(f"{path}: train_state.{problem}; the file is damaged, and --resume cannot go on "
                              "from it")


def train_state_problem(saved: dict) -> str | None:
    """The first field of a saved train state that `TrainState.load` cannot take, in words ("epoch is -1, ..."),
    or None."""
    for key in COUNTS + OPTIONAL_COUNTS:
        if key in COUNTS or saved.get(key) is not None:
            value = saved.get(key)
            if not is_count(value):
                return f"{key} is {value!r}, not a whole number of 0 or more"
    score = saved.get("best_score")
    if not is_number(score) or math.isnan(score):
        return f"best_score is {score!r}, not a number"
    history = saved.get("history", [])
    if not isinstance(history, list):
        return f"history is a {type(history).__name__}, not a list of rows"
    for i, row in enumerate(history):
        if not (isinstance(row, dict) and is_count(row.get("epoch")) and is_count(row.get("step"))
                and all(isinstance(k, str) and is_number(v) for k, v in row.items())):
            return f"history[{i}] is {str(row)[:80]}, not a row of numbers with its epoch and step"
    losses = saved.get("step_losses", [])
    if not isinstance(losses, list):
        return f"step_losses is a {type(losses).__name__}, not a list of [step, loss] pairs"
    for i, pair in enumerate(losses):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and is_count(pair[0]) and is_number(pair[1])):
            return f"step_losses[{i}] is {str(pair)[:80]}, not a [step, loss] pair"
    for key in ("running", "epoch_sums"):
        value = saved.get(key)
        if value is not None and not (isinstance(value, torch.Tensor) and value.dim() == 1
                                      and value.is_floating_point()):
            return f"{key} is {str(value)[:80]}, not a tensor of sums"
    return None


def is_count(value: object) -> bool:
    """A whole number of 0 or more (JSON true/false are none)."""
    return is_int(value) and value >= 0


def rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # this process's GPU (torchrun: LOCAL_RANK's)
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    try:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(state["torch"])
    except (KeyError, IndexError, AttributeError, TypeError, ValueError, OverflowError, RuntimeError) as e:
        raise CheckpointError(f"the checkpoint's random number generator states are malformed ({e})") from None
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def restore_rng(saved: dict, ctx: Distributed, seed: int, state: TrainState) -> None:
    """Put back this rank's generators as they were at the checkpoint. A checkpoint from
    another number of processes can only go on at an epoch boundary, with fresh streams."""
    states = saved.get("rng")
    if states is not None and len(states) == ctx.world_size:
        set_rng_state(states[ctx.rank])
        return
    if state.position:
        raise CheckpointError(f"{saved.get('world_size', '?')} processes wrote this mid-epoch checkpoint; resume it "
                              f"with as many (this run has {ctx.world_size}), or from an end-of-epoch checkpoint")
    log.warning("the checkpoint holds no random states for %d processes: resuming with fresh ones (not bit-exact)",
                ctx.world_size)
    seed_everything(seed + 1000 * state.epoch + ctx.rank)


def read_resume_checkpoint(config: Config, trained_on: dict | None = None, ctx: Distributed | None = None) -> dict:
    """train.out_dir's last.pt, whose model section must be the config's, and whose data, where it recorded them,
    must be `trained_on` (`training_data`: the training records, and the val records the run scores): resumed on
    other data, a run is no longer the one that never stopped. Under torchrun rank 0's refusal stops every rank."""
    problem, checkpoint = None, {}
    try:
        checkpoint = checked_resume_checkpoint(config, trained_on)
    except CaptionerError as e:
        problem = e
    (ctx or Distributed(torch.device("cpu"))).agree(problem)
    return checkpoint


def checked_resume_checkpoint(config: Config, trained_on: dict | None) -> dict:
    """`read_resume_checkpoint` on this rank alone."""
    last = Path(config.train.out_dir) / "last.pt"
    require_resumable(last)
    checkpoint = read_checkpoint(last)
    check_train_state(checkpoint, last)
    if checkpoint["config"].get("model") != config.to_dict()["model"]:
        raise CheckpointError(f"{last}: the model section of the config differs from the checkpoint's; cannot resume")
    recorded = checkpoint["train_state"].get("data")
    if trained_on and isinstance(recorded, dict) and recorded:  # old: none
        difference = data_difference(config, recorded, trained_on)
        if difference is not None:
            raise CheckpointError(f"--resume: {last} {difference}: resume with the same data, or start a new run")
    return checkpoint


def training_data(records: Sequence[ImageRecord], shards: ShardSet | None = None,
                  val_records: Sequence[ImageRecord] | None = None) -> dict:
    """What a run trains on, wherever its files lie, kept in last.pt for --resume: the number of training images
    and a digest of their ids and captions, in order; for streamed shards, of samples and each shard's count (what
    their index says: no shard is read). With `val_records` (those validation scores: best.pt and early stopping
    follow them), their number and digest too."""
    if shards is not None:
        digest = hashlib.blake2b(json.dumps(shards.counts).encode(), digest_size=12)
        recorded = {"train_samples": shards.samples, "digest": digest.hexdigest()}
    else:
        recorded = {"train_images": len(records), "digest": records_digest(records)}
    if val_records is not None:
        recorded |= {"val_images": len(val_records), "val_digest": records_digest(val_records)}
    return recorded


def records_digest(records: Sequence[ImageRecord]) -> str:
    """A digest of the records' ids and captions, in order."""
    digest = hashlib.blake2b(digest_size=12)
    for record in records:
        digest.update("\x1f".join([str(record.image_id), *record.captions]).encode() + b"\x1e")
    return digest.hexdigest()


def data_difference(config: Config, recorded: dict, trained_on: dict) -> str | None:
    """How the data a checkpoint recorded differ from this run's, in words, naming the split; None if they do not.
    A record without the val records (an older checkpoint's) is compared on the training data alone."""
    streamed = "train_samples" in trained_on
    where = (f"data.train_shards={config.data.train_shards}" if streamed else f"data.root={config.data.root}")
    kind = "train_samples" if streamed else "train_images"
    what = "training samples" if streamed else "training images"
    was, now = recorded.get(kind), trained_on[kind]
    if not isinstance(was, int):
        return f"was trained on other data than {where}"
    if was != now:
        return f"was trained on {was:,} {what}, {where} has {now:,}"
    if recorded.get("digest") != trained_on.get("digest"):
        other = "other counts per shard" if streamed else "other ids or captions, or in another order"
        return f"was trained on other data than {where} holds (the same {now:,} {what}, {other})"
    if "val_digest" not in recorded or "val_digest" not in trained_on:
        return None
    return val_difference(config, recorded, trained_on)


def val_difference(config: Config, recorded: dict, trained_on: dict) -> str | None:
    """How the val records a checkpoint recorded differ from those this run scores, in words; None if they do not."""
    where = (f"data.val_shards={config.data.val_shards}" if config.data.dataset == "webdataset"
             else f"data.root={config.data.root}")
    if config.train.val_max_images:
        where += f" with train.val_max_images={config.train.val_max_images}"
    was, now = recorded.get("val_images"), trained_on["val_images"]
    if was != now:
        return f"was validated on {was:,} val images, {where} gives {now:,}" if isinstance(was, int) else \
            f"was validated on other val images than {where} gives"
    if recorded["val_digest"] != trained_on["val_digest"]:
        return (f"was validated on other val images than {where} gives (the same {now:,}, other ids or captions, "
                "or in another order)")
    return None


TRAINING_CHOICES = ("model.encoder.fine_tune_blocks",)  # how a stage trains the model, not what the model is


def read_init_checkpoint(config: Config) -> dict:
    """The checkpoint `train.init` names, whose model section must be the config's, except for
    the TRAINING_CHOICES: a stage may fine-tune an encoder that the previous one kept frozen
    (a model trained on the feature store), or freeze one it fine-tuned. The weights fit either way."""
    path = config.train.init
    checkpoint = read_checkpoint(path, for_inference=True)  # its weights and words: a stage starts a new optimizer
    saved, current = checkpoint["config"].get("model", {}), config.to_dict()["model"]
    for dotted in TRAINING_CHOICES:
        was, now = value_at({"model": saved}, dotted), value_at({"model": current}, dotted)
        if was != now:
            log.info("%s: %s is %r in the checkpoint, %r here: this stage trains as its config says",
                     path, dotted, was, now)
    conflict = first_difference(saved, current, "model", skip=TRAINING_CHOICES)
    if conflict:
        raise CheckpointError(f"{path}: {conflict}; train.init needs the model section the checkpoint was trained with")
    return checkpoint


def first_difference(saved: object, current: object, key: str, skip: tuple[str, ...] = ()) -> str | None:
    """'model.x.y is A in the checkpoint but B in the config' for the first differing key not in `skip`, or None."""
    if key in skip:
        return None
    if isinstance(saved, dict) and isinstance(current, dict):
        found = (first_difference(saved.get(name), current.get(name), f"{key}.{name}", skip)
                 for name in {**saved, **current})
        return next(filter(None, found), None)
    return None if saved == current else f"{key} is {saved!r} in the checkpoint but {current!r} in the config"
