"""Training a model from a config: `fit(config)` runs the epochs with validation and checkpoints.

best.pt is chosen by the scores of decoded val captions (BLEU/CIDEr-D), never by teacher-forced loss.
Every torchrun rank runs this code; last.pt holds what an exact resume needs (position, sums, RNG states)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from captioner.core.config import dump_config
from captioner.core.config_sections import Config
from captioner.core.errors import CheckpointError, ConfigError, DatasetError, first_line
from captioner.core.files import same_file_as, write_failure
from captioner.core.process_settings import ThreadGovernor, resolve_device, seed_everything
from captioner.data.bounded_tar import shard_limits
from captioner.data.datasets import load_split, seeded_split_record, split_shards
from captioner.data.records import ImageRecord
from captioner.data.batching import EpochBatchSampler
from captioner.data.shards import ShardSet, open_shard_set, shard_captions
from captioner.data.streaming import ShardStream
from captioner.evaluation.evaluate import caption_records, references_for
from captioner.evaluation.metrics import fast_scores
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import save_checkpoint
from captioner.models.decoder import DecoderOutput
from captioner.text.vocab import SPECIALS, Vocabulary
from captioner.training import distributed
from captioner.training.distributed import Distributed
from captioner.training.history import (METRICS, STEP_LOSSES, clear_finished, patience_spent, why_training_ended,
                                        write_finished, write_history, write_step_losses)
from captioner.training.loop import Interrupted, Objective, StopSignals, train_one_epoch
from captioner.training.run_folders import run_folder_held
from captioner.training.run_setup import (RunData, accelerate, caption_dataset, decide_speed, log_batch_plan, lr_scale,
                                          make_loader, make_objective, make_optimizer, make_scheduler, stored_data,
                                          uses_feature_store, wrap_for_ddp)
from captioner.training.speed import SpeedChoices, decide_threads
from captioner.training.state import (LOGGED, TrainState, check_finite_loss, read_init_checkpoint,
                                      read_resume_checkpoint, restore_rng, rng_state, training_data)

log = logging.getLogger(__name__)


def fit(config: Config, resume: bool = False) -> Path:
    """Train a model as `config` says; returns the path of the best checkpoint. Rank 0 alone writes files;
    `data.batch_size` is per process, and the learning rate is as configured unless train.lr_scaling says otherwise."""
    ctx = distributed.setup(resolve_device(config.train.device, "train.device"), config.train.dist_timeout_minutes)
    # an earlier run, a file where a folder of the run goes, or a run training there now: before any work
    with run_folder_held(config, resume, ctx):
        return train_in_folder(config, resume, ctx)


def train_in_folder(config: Config, resume: bool, ctx: Distributed) -> Path:
    """`fit`'s work, in the run folder rank 0 made and holds."""
    out_dir = Path(config.train.out_dir)
    seed_everything(config.train.seed)
    train_records, val_records, all_val_records = load_records(config, ctx)
    shards = train_shard_set(config)  # streamed training: the shards and their counts, no records
    # where the files lie aside: --resume refuses other training data, or other val images to score
    trained_on = training_data(train_records, shards, val_records)
    checkpoint = read_resume_checkpoint(config, trained_on, ctx) if resume else None
    if checkpoint is not None and finished_before(config, checkpoint["train_state"], ctx):
        distributed.shutdown(ctx)
        return out_dir / "best.pt"
    # Fixed before any sums (the feature store's included), and taken back from last.pt.
    threads, governor = decide_threads(config, checkpoint and checkpoint["train_state"], str(out_dir / "last.pt"))
    initial = read_init_checkpoint(config) if config.train.init and checkpoint is None else None
    captions = (c for r in train_records for c in r.captions) if shards is None else shard_captions(shards, ctx.is_main)
    source = out_dir / "last.pt" if checkpoint is not None else config.train.init  # where the weights come from
    vocab = choose_vocabulary(config, checkpoint or initial, captions, source)
    log.info("%s: %d train images%s, %d val images, vocabulary %d words (min count %d)", config.data.dataset,
             len(train_records) if shards is None else shards.samples,
             "" if shards is None else f" in {len(shards.urls)} shards, streamed", len(val_records), len(vocab),
             config.data.min_word_count)
    model = Captioner.from_config(config, vocab, load_pretrained=checkpoint is None and initial is None).to(ctx.device)
    if checkpoint or initial:
        # the encoder too: fine-tuned layers stay so; a damaged file's weights that do not fit are one line naming it
        model._load_weights((checkpoint or initial)["model"], Path(source))
    # last.pt's optimizer, schedule and random states restored (a damaged one refused) before the run's files change
    run = Run.start(config, ctx, model, train_records, val_records, all_val_records, checkpoint, shards, threads)
    if ctx.is_main:
        write_run_files(config, vocab, out_dir)
    del checkpoint, initial  # read into the model and the optimizer: their copies of the weights go before training
    run.threads, run.trained_on = governor, trained_on
    if ctx.is_main:
        clear_finished(out_dir)
    run.stop.install()  # from here a SIGTERM or SIGINT ends the step, saves last.pt and raises Interrupted
    try:
        run.train()
    except Interrupted:
        # no rank leaves before rank 0 has written last.pt (torchrun stops the others when one exits)
        ctx.barrier()
        distributed.shutdown(ctx)
        raise
    finally:
        run.stop.restore()
        if run.state.writer is not None:
            run.state.writer.close()
    if ctx.is_main:
        write_finished(out_dir, {key: getattr(run.state, key) for key in FINISHED_KEYS})
        log.info("best val %s %.4f at epoch %d, step %d: %s", config.train.val_metric, run.state.best_score,
                 run.state.best_epoch, run.state.best_step, out_dir / "best.pt")
    distributed.shutdown(ctx)
    return out_dir / "best.pt"


FINISHED_KEYS = ("epoch", "step", "best_epoch", "best_step")  # what finished.json records of where the run ended


def finished_before(config: Config, saved: dict, ctx: Distributed) -> bool:
    """Whether last.pt's train state `saved` stands where the training ended as `config` says (its epochs done, or
    early stopping's patience spent): then no step is trained (an early-stopped run would train one more epoch),
    finished.json is written and one line says so. A run from before finished.json, or resumed once more by hand.
    False, and nothing done, while it has epochs to train: that run resumes exactly."""
    if saved.get("position"):  # mid-epoch: its sums are the objective's, which this state does not know
        return False
    state = TrainState()
    state.load(saved, torch.device("cpu"))  # takes best_step from the history where an old last.pt lacks it
    train = config.train
    ended = why_training_ended(state.epoch, state.best_epoch, train.epochs, train.early_stopping_patience)
    if ended is None:
        return False
    if ctx.is_main:
        write_finished(Path(train.out_dir), {key: getattr(state, key) for key in FINISHED_KEYS})
        log.info("--resume: %s ended at epoch %d, step %d (%s): nothing to train, finished.json written (raise "
                 "train.epochs or train.early_stopping_patience to train on)", Path(train.out_dir) / "last.pt",
                 state.epoch, state.step, ended)
    return True


def write_run_files(config: Config, vocab: Vocabulary, out_dir: Path) -> None:
    """The run's vocab.json, config.yaml and drawn split, once everything --resume reads has held: a refused resume
    leaves the folder as it was."""
    try:
        vocab.save(out_dir / "vocab.json")
        dump_config(config, out_dir / "config.yaml")
        drawn = seeded_split_record(config.data)
        if drawn is not None:  # the split this run drew, so evaluation elsewhere can be checked against it
            (out_dir / "splits.json").write_text(json.dumps(drawn, indent=1))
    except OSError as e:  # a full disk before the first step: one line naming the file
        raise write_failure(Path(e.filename or out_dir), e) from None


def load_records(config: Config, ctx: Distributed) -> tuple[list[ImageRecord], list[ImageRecord], list[ImageRecord]]:
    """(train, the val images validated on, the whole val split). The shapes world is generated on
    first use: by rank 0, before the others read it."""
    streamed = config.data.dataset == "webdataset"  # the train shards are streamed, never loaded whole
    if not ctx.is_main:
        ctx.barrier()
    train = [] if streamed else load_split(config.data, "train")
    if ctx.is_main:
        ctx.barrier()
    all_val = load_split(config.data, "val")
    if not all_val:  # an image folder drawn with data.val_fraction 0, or too small to hold one out
        raise DatasetError(f"{config.data.root}: the val split is empty, and training picks best.pt on it: "
                           "set data.val_fraction above 0 or add a validation split")
    return train, all_val[: config.train.val_max_images] if config.train.val_max_images else all_val, all_val


def train_shard_set(config: Config) -> ShardSet | None:
    """The train shards a webdataset run streams (their counts read from the index); else None."""
    if config.data.dataset != "webdataset":
        return None
    return open_shard_set(split_shards(config.data, "train"), "data.train_shards", shard_limits(config.data))


def choose_vocabulary(config: Config, checkpoint: dict | None, captions: Iterable[str],
                      source: str | Path | None) -> Vocabulary:
    """A resumed or initialised run keeps its checkpoint's words (`source` names its file); a new one counts the
    training captions."""
    if checkpoint is not None:
        try:
            return Vocabulary(checkpoint["vocab"])
        except (DatasetError, TypeError) as e:  # not a list of words that starts with the special tokens
            raise CheckpointError(f"{source}: its vocab is damaged ({first_line(e)})") from None
    if config.train.stage == "scst":
        raise ConfigError("train.stage: scst starts from a cross-entropy model: "
                          "set train.init (or pass --init CHECKPOINT)")
    vocab = Vocabulary.build(captions, config.data.min_word_count)
    if len(vocab) <= len(SPECIALS):  # a model that can write nothing but <eos>: a run that teaches nothing
        raise DatasetError(f"{config.data.dataset} ({config.data.root}): the training captions hold no word seen "
                           f"{config.data.min_word_count} times or more (data.min_word_count); empty captions?")
    return vocab


@dataclass
class Run:
    """Everything one training run holds between its steps, and what it does at its events
    (a step, a validation, an epoch's end). Every rank has one; rank 0 alone writes."""

    config: Config
    ctx: Distributed
    model: Captioner
    forward: Callable[..., DecoderOutput]  # the model, or its DDP wrapper
    objective: Objective
    loader: DataLoader | ShardStream
    sampler: EpochBatchSampler | ShardStream  # a stream is its own sampler
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    state: TrainState
    data: RunData  # what the run trains and validates on
    resumed: bool
    started: float
    speed: SpeedChoices
    stop: StopSignals = field(default_factory=StopSignals)
    threads: ThreadGovernor | None = None  # train.follow_free_cores: the thread count follows the free cores (CPU)
    best_written_at: tuple[int, int, int] | None = None  # (step, epoch, position) of the last best.pt written
    trained_on: dict = field(default_factory=dict)  # the train and val data's counts, digests (state.training_data)

    @property
    def out_dir(self) -> Path:
        return Path(self.config.train.out_dir)

    @classmethod
    def start(cls, config: Config, ctx: Distributed, model: Captioner, train_records: list[ImageRecord],
              val_records: list[ImageRecord], all_val_records: list[ImageRecord], checkpoint: dict | None,
              shards: ShardSet | None = None, threads: int | None = None) -> Run:
        """The data (images, or the feature store for a frozen encoder), the steps' speed choices, the objective,
        the optimiser and schedule, the DDP wrapper; then the checkpoint's state when resuming, and rank 0's
        TensorBoard writer. `threads`: the count `decide_threads` fixed."""
        state = TrainState(encoded=uses_feature_store(config, model, shards))
        data = (stored_data(config, ctx, model, train_records, val_records, all_val_records) if state.encoded
                else RunData(train_records, val_records))
        if config.train.channels_last or config.train.compile:
            accelerate(model, config, ctx.device, state.encoded)
        speed = decide_speed(config, ctx, model, state, data, checkpoint, threads)
        train_set = caption_dataset(config, model, data, ctx.device)
        objective = make_objective(config, model, train_set)
        state.logged = getattr(objective, "logged", LOGGED)  # SelfCritical names its own
        loader, sampler = make_loader(config, ctx, train_set, shards, model.vocab)
        log_batch_plan(config, ctx, sampler)
        optimizer = make_optimizer(model, config, lr_scale(config, sampler.global_batch))
        scheduler = make_scheduler(optimizer, config, len(sampler))
        forward = wrap_for_ddp(model, config, ctx)
        state.reset_sums(ctx.device)
        run = cls(config, ctx, model, forward, objective, loader, sampler, optimizer, scheduler, state, data,
                  checkpoint is not None, time.time(), speed)
        if checkpoint is not None:
            run.restore(checkpoint)
        elif ctx.enabled:  # the same initial weights everywhere, then each rank its own dropout masks
            seed_everything(config.train.seed + ctx.rank)
        if ctx.is_main:  # TensorBoard: a resumed run drops the events and history rows logged after its checkpoint
            from torch.utils.tensorboard import SummaryWriter

            purge_step = state.step + 1 if checkpoint else None
            state.writer = SummaryWriter(str(run.out_dir / "tensorboard"), purge_step=purge_step)
            if checkpoint is not None:
                write_history(run.out_dir / METRICS, state.history)
        return run

    def restore(self, checkpoint: dict) -> None:
        """The optimiser, schedule, position and random streams of last.pt."""
        state, ctx, saved, last = self.state, self.ctx, checkpoint["train_state"], self.out_dir / "last.pt"
        for key, part in (("optimizer", self.optimizer), ("scheduler", self.scheduler)):
            try:
                part.load_state_dict(checkpoint[key])
            except (KeyError, IndexError, AttributeError, TypeError, ValueError, RuntimeError) as e:  # damaged
                raise CheckpointError(f"{last}: its {key} state does not fit this run's ({first_line(e)}); "
                                      "--resume cannot go on from it") from None
        state.load(saved, ctx.device, str(last))
        if isinstance(self.loader, ShardStream):
            self.sampler.set_epoch(state.epoch + 1)  # the epoch's plan gives its length
            if state.position:
                streams = saved.get("stream") or []
                if len(streams) != ctx.world_size:
                    raise CheckpointError(f"{last}: a mid-epoch checkpoint without the stream positions of "
                                          f"{ctx.world_size} rank(s)")
                self.loader.resume(streams[ctx.rank], str(last))
        if state.position > len(self.sampler):
            raise CheckpointError(f"{last}: saved at batch {state.position} of an epoch of {len(self.sampler)}; "
                                  "the data or batch size changed")
        restore_rng(saved, ctx, self.config.train.seed, state)
        log.info("resumed from %s at epoch %d, batch %d, step %d", last, state.epoch + 1, state.position, state.step)

    def train(self) -> None:
        """The epochs left, each validated; an SCST stage first validates its starting model."""
        state, config = self.state, self.config
        if config.train.stage == "scst" and not self.resumed:
            # The starting model is the first candidate, so SCST's best.pt is never worse on val
            # than its init, and the log shows where the stage starts from.
            self.check(0, {"epoch": 0, "step": 0}, f"start ({config.train.init})", time.time())
        for epoch in range(state.epoch + 1, config.train.epochs + 1):
            epoch_start = time.time()
            if state.position == 0:
                state.reset_sums(self.ctx.device)
            self.sampler.set_epoch(epoch, start=state.position)
            train_one_epoch(self.model, self.forward, self.loader, self.optimizer, self.scheduler, config, self.ctx,
                            epoch, state, self.after_step, self.objective, self.stop)
            if self.stop.signal is not None:  # every rank stopped after the same step
                self.keep_progress()
                raise Interrupted(self.stop.signal, str(self.out_dir / "last.pt"), state.step)
            means = state.read_epoch_means(self.ctx)
            if state.epoch_steps:  # none: an epoch resumed at its end, its means unknown
                check_finite_loss(means["loss"], state.step, config)
            state.epoch, state.position = epoch, 0
            row = {"epoch": epoch, "step": state.step, "train_loss": round(means["loss"], 5),
                   "lr": self.scheduler.get_last_lr()[0]}
            row |= {f"train_{k}": round(v, 5) for k, v in means.items() if k != "loss"}
            self.check(epoch, row, f"epoch {epoch}/{config.train.epochs}  loss {means['loss']:.3f}", epoch_start)
            self.keep_progress()
            if self.ctx.broadcast(should_stop(config, state, epoch, self.started) if self.ctx.is_main else None):
                break

    def after_step(self) -> None:
        """The thread count, then mid-epoch validation (train.val_every_steps) or checkpoint
        (train.checkpoint_every_steps)."""
        if self.threads is not None and self.threads.adjust() is not None:
            log.info("threads %d -> %d: the cores free beside this run changed", *self.threads.changes[-1])
        state, every = self.state, self.config.train.val_every_steps
        if every and state.step % every == 0 and state.position < len(self.loader):  # an epoch's end validates anyway
            epoch = state.epoch + 1
            done = round(state.epoch + state.position / len(self.loader), 4)  # epochs trained, with this one's fraction
            row = {"epoch": epoch, "step": state.step, "epochs_done": done}
            self.check(epoch, row, f"epoch {epoch}, step {state.step}", time.time())
            self.model.train()  # validation decoded in eval mode
            self.keep_progress()
        elif self.config.train.checkpoint_every_steps and state.step % self.config.train.checkpoint_every_steps == 0:
            self.save("last.pt")

    def check(self, epoch: int, row: dict, label: str, since: float) -> None:
        """Validate; log `row` with the scores and the seconds since `since` into the history;
        keep best.pt. Every rank calls it."""
        state, metric = self.state, self.config.train.val_metric
        scores, example = self.validate()
        improved = scores[metric] > state.best_score
        if improved:
            state.best_score, state.best_epoch, state.best_step = scores[metric], epoch, state.step
        row |= {f"val_{k}": round(v, 5) for k, v in scores.items()} | {"seconds": round(time.time() - since, 1)}
        state.history.append(row)
        if self.ctx.is_main:
            for key, value in scores.items():
                state.writer.add_scalar(f"val/{key}", value, state.step)
            log.info("%s  val %s %.4f  CIDEr-D %.3f%s  (%.0fs)  e.g. %r", label, metric, scores[metric],
                     scores["CIDEr"], "  *best*" if improved else "", row["seconds"], example)
        if improved:
            self.save("best.pt")
            self.best_written_at = self.where()

    def validate(self) -> tuple[dict[str, float], str]:
        """Greedy (or beam: train.val_beam_size) captions of the val images, each rank its share, scored on the
        gathered whole (every rank gets the same scores); returns the scores and one example caption."""
        records, features = self.data.val_records, self.data.val_features
        mine = self.ctx.shard(list(range(len(records))))
        captions = caption_records(self.model, [records[i] for i in mine], beam_size=self.config.train.val_beam_size,
                                   features=None if features is None else features[mine], grid=self.data.grid,
                                   num_workers=self.config.data.num_workers, progress=False)
        texts = {image_id: c.text for image_id, c in captions.items()}
        merged = {k: v for part in self.ctx.all_gather(texts) for k, v in part.items()}
        return fast_scores(references_for(records, merged), merged), next(iter(merged.values()), "")

    def where(self) -> tuple[int, int, int]:
        return self.state.step, self.state.epoch, self.state.position

    def keep_progress(self) -> None:
        """last.pt and the history files after a validation, so a resume starts where best.pt and the history
        stand. If best.pt was just written, last.pt becomes a second name for it, not a second copy."""
        if self.best_written_at == self.where():
            if self.ctx.is_main:  # every rank decides alike: no rank gathers for a save here
                same_file_as(self.out_dir / "best.pt", self.out_dir / "last.pt")
        else:
            self.save("last.pt")
        if self.ctx.is_main:
            write_history(self.out_dir / METRICS, self.state.history)
            write_step_losses(self.out_dir / STEP_LOSSES, self.state.step_losses)

    def save(self, name: str) -> None:
        """Every rank calls this (it gathers their RNG states); rank 0 writes."""
        rng = self.ctx.all_gather(rng_state())
        streams = self.ctx.all_gather(self.loader.positions()) if isinstance(self.loader, ShardStream) else None
        if self.ctx.is_main:
            train_state = {**self.state.to_dict(), **self.speed.to_dict(), "world_size": self.ctx.world_size,
                           "rng": rng, "stream": streams, "data": self.trained_on}
            save_checkpoint(self.out_dir / name, self.model, self.config, optimizer=self.optimizer.state_dict(),
                            scheduler=self.scheduler.state_dict(), train_state=train_state)


def should_stop(config: Config, state: TrainState, epoch: int, started: float) -> bool:
    patience = config.train.early_stopping_patience
    if patience_spent(epoch, state.best_epoch, patience):
        log.info("early stopping: no better val %s for %d epochs", config.train.val_metric, patience)
        return True
    limit = config.train.time_limit_minutes
    if limit and time.time() - started > limit * 60:
        log.info("stopping: the time limit of %g minutes is spent", limit)
        return True
    return False
