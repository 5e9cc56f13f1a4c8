"""Exact resume: a run killed with SIGKILL in the middle of an epoch and resumed with --resume
ends with the very weights (bit for bit) and metrics of the run that was never interrupted."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY_MODEL, subprocess_env
import warm_start

from captioner.core import machine_cache
from captioner.data.batching import EpochBatchSampler
from captioner.data.shapes import generate_shapes
from captioner.models import products
from captioner.training.state import rng_state, set_rng_state

ROOT = Path(__file__).resolve().parents[1]

# 48 images, batch 4: 12 steps an epoch, a mid-epoch checkpoint every 3. Dropout, one random
# caption per image and augmentation all draw random numbers that the resume must replay.
TINY = [
    *TINY_MODEL,
    "data.batch_size=4",
    "data.captions_per_image=one",
    "data.augment=true",
    "model.decoder.dropout=0.3",
    "train.epochs=2",
    "train.warmup_steps=3",
    "train.log_every=1",
    "train.checkpoint_every_steps=3",
    "train.val_max_images=4",
    "train.early_stopping_patience=0",
    "train.device=cpu",
    "decode.max_length=8",
]


def train_command(data: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "captioner", "-v", "train", "configs/shapes_lstm.yaml", *TINY,
            f"data.root={data}", f"train.out_dir={out}", *extra]


def environment(**extra: str) -> dict[str, str]:
    # One thread: the same float sums in every run (CAPTIONER_THREADS, since captioner.core.process_settings otherwise
    # picks the cores free at start, which differ between the reference and the resumed run under load).
    return subprocess_env(**extra)


def machine_deciding(cache: Path, onednn: bool, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of a process on a machine whose measured decision (a cache folder saying so) is
    oneDNN's products with weight and input gradients by torch.mm, or F.linear."""
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(cache))
    machine_cache.remember(products.CALIBRATION, {"onednn": onednn, "onednn_ms": 2.0, "linear_ms": 1.0,
                                                  "gram_mm": onednn, "gram_onednn_ms": 2.0, "gram_mm_ms": 1.0,
                                                  "grad_mm": onednn, "grad_onednn_ms": 2.0, "grad_mm_ms": 1.0})
    env = environment(CAPTIONER_CACHE_DIR=str(cache))
    env.pop("CAPTIONER_ONEDNN", None)
    return env


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    generate_shapes(root, 48, 4, 2, image_size=32, seed=0, progress=False)
    return root


def logged_steps(output: str) -> list[int]:
    return [int(m) for m in re.findall(r"step (\d+) loss", output)]


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_is_bit_identical(shapes: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The run to resume took oneDNN's products and weight gradients by torch.mm; the resumption runs where
    the machine's own decision says F.linear (other summation orders): it must take the checkpoint's route."""
    first_part = machine_deciding(tmp_path / "first_cache", True, monkeypatch)
    reference = warm_start.Popen(train_command(shapes, tmp_path / "reference"), cwd=ROOT, env=first_part,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # beside the killed run
    run = tmp_path / "killed"
    run.mkdir()
    (run / "finished.json").write_text("{}")  # an earlier end's record, stale once this run trains into the folder
    process = warm_start.Popen(train_command(shapes, run), cwd=ROOT, env=first_part,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (run / "last.pt").exists():  # the first checkpoint is mid-epoch (step 3 of 12)
        assert process.poll() is None and time.time() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (run / "finished.json").exists()  # cut short (what the sweep scripts resume), the stale record gone
    _, reference_err = reference.communicate(timeout=600)
    assert reference.returncode == 0, reference_err[-2000:]
    assert logged_steps(reference_err) == list(range(1, 25))
    saved = torch.load(run / "last.pt", weights_only=True)["train_state"]
    assert saved["position"] > 0, "the kill came only at an epoch boundary (machine too slow for this test?)"

    assert saved["onednn_products"] is saved["gram_mm"] is saved["grad_mm"] is products.onednn_enabled()
    resumed = warm_start.run([*train_command(shapes, run), "--resume"], cwd=ROOT,
                             env=machine_deciding(tmp_path / "cache", False, monkeypatch),
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (run / "finished.json").is_file() and (tmp_path / "reference" / "finished.json").is_file()
    if saved["onednn_products"]:
        assert "products: oneDNN, the route" in resumed.stderr
    # It went on from the saved batch, not from the start (an ignored --resume would start at step 1).
    assert f"at epoch {saved['epoch'] + 1}, batch {saved['position']}, step {saved['step']}" in resumed.stderr
    assert logged_steps(resumed.stderr) == list(range(saved["step"] + 1, 25))

    expected = torch.load(tmp_path / "reference" / "last.pt", weights_only=True)
    got = torch.load(run / "last.pt", weights_only=True)
    assert expected["model"].keys() == got["model"].keys()
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, got["model"][name]), name
    for key, state in expected["optimizer"]["state"].items():
        for name, tensor in state.items():
            assert torch.equal(tensor, got["optimizer"]["state"][key][name]), (key, name)

    def rows(path: Path) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(open(path))]

    assert rows(run / "metrics.csv") == rows(tmp_path / "reference" / "metrics.csv")  # same numbers, no duplicated row
    assert [int(r["epoch"]) for r in rows(run / "metrics.csv")] == [1, 2]


def test_sampler_order_depends_on_seed_and_epoch_only() -> None:
    sampler = EpochBatchSampler(10, batch_size=3, seed=7)
    sampler.set_epoch(2)
    epoch2 = list(sampler)
    assert len(epoch2) == len(sampler) == 3  # full batches only
    assert len({i for batch in epoch2 for i, _ in batch}) == 9
    again = EpochBatchSampler(10, batch_size=3, seed=7)
    again.set_epoch(2, start=1)
    assert list(again) == epoch2[1:]  # entered at batch 1: the rest of the same order
    sampler.set_epoch(3)
    assert list(sampler) != epoch2  # reshuffled every epoch
    with pytest.raises(ValueError):
        sampler.set_epoch(3, start=4)


def test_a_dataset_smaller_than_a_batch_is_one_batch() -> None:
    single = EpochBatchSampler(5, batch_size=8, seed=0)
    assert len(single) == 1 and sorted(i for i, _ in next(iter(single))) == [0, 1, 2, 3, 4]
    ranks = [list(EpochBatchSampler(5, batch_size=8, seed=0, rank=r, world_size=2))[0] for r in range(2)]
    assert [len(batch) for batch in ranks] == [3, 3]  # equal shares: one image twice
    assert {i for batch in ranks for i, _ in batch} == {0, 1, 2, 3, 4}


def test_ranks_split_the_single_process_batches() -> None:
    """Two ranks of batch 2 see, at each step, exactly the batch 4 of one process."""
    single = EpochBatchSampler(11, batch_size=4, seed=3)
    ranks = [EpochBatchSampler(11, batch_size=2, seed=3, rank=r, world_size=2) for r in range(2)]
    for sampler in (single, *ranks):
        sampler.set_epoch(5)
    together = [sorted(a + b) for a, b in zip(*ranks)]
    assert together == [sorted(batch) for batch in single]
    assert all(not set(a) & set(b) for a, b in zip(*ranks))


def test_workers_load_the_same_batches_as_the_main_process(shapes: Path) -> None:
    """Caption choice and augmentation come from the sampler's draws, not from the RNG of the
    process that loads the item: any number of workers gives the same batches, bit for bit."""
    from torch.utils.data import DataLoader

    from captioner.core.config import load_config
    from captioner.data.batching import CaptionDataset, collate_captions
    from captioner.data.datasets import load_split
    from captioner.data.image_transform import ImageTransform
    from captioner.text.vocab import Vocabulary

    config = load_config(None, [f"data.root={shapes}", "data.image_size=32"])
    records = load_split(config.data, "train")[:12]
    vocab = Vocabulary.build(c for r in records for c in r.captions)
    dataset = CaptionDataset(records, vocab, ImageTransform(32, train=True, augment=True), 20, "one")
    batches = {}
    for workers in (0, 2):
        sampler = EpochBatchSampler(len(dataset), batch_size=4, seed=1)
        sampler.set_epoch(3, start=1)
        loader = DataLoader(dataset, batch_sampler=sampler, num_workers=workers, collate_fn=collate_captions)
        batches[workers] = list(loader)
    assert len(batches[0]) == 2
    for a, b in zip(batches[0], batches[2]):
        assert torch.equal(a.images, b.images) and torch.equal(a.tokens, b.tokens) and torch.equal(a.indices, b.indices)
    again = list(DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_captions))  # epoch 3 again
    assert torch.equal(again[0].images, batches[0][0].images)
    sampler.set_epoch(4)
    assert not torch.equal(next(iter(DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_captions))).images,
                           batches[0][0].images)


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path: Path) -> None:
    import random

    import numpy as np

    state = rng_state()
    torch.save({"rng": state}, tmp_path / "rng.pt")
    first = (random.random(), np.random.rand(), torch.rand(3))
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True)["rng"])
    second = (random.random(), np.random.rand(), torch.rand(3))
    assert first[0] == second[0] and first[1] == second[1] and torch.equal(first[2], second[2])


@pytest.mark.slow
def test_validating_mid_epoch_changes_no_weight_and_keeps_the_best_step(shapes: Path, tmp_path: Path) -> None:
    """train.val_every_steps validates inside the epochs: training goes on with the same weights
    and random numbers (dropout back on, the loaders' seeds not drawn from training's generator),
    and best.pt is the model of the best validation, wherever in an epoch it came."""
    # the best CIDEr-D comes mid-epoch 2 (step 16)
    common = ("train.epochs=3", "train.lr=2e-3", "train.val_metric=CIDEr")
    runs = {name: warm_start.Popen(train_command(shapes, tmp_path / name, *common, *extra), cwd=ROOT, env=environment(),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for name, extra in (("epochs", ()), ("steps", ("train.val_every_steps=4",)))}
    for name, process in runs.items():
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, (name, err[-2000:])

    expected = torch.load(tmp_path / "epochs" / "last.pt", weights_only=True)["model"]
    got = torch.load(tmp_path / "steps" / "last.pt", weights_only=True)["model"]
    for name, tensor in expected.items():
        assert torch.equal(tensor, got[name]), name

    rows = list(csv.DictReader(open(tmp_path / "steps" / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == list(range(4, 37, 4))  # 12 steps an epoch
    assert [int(r["epoch"]) for r in rows] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [r["epochs_done"] for r in rows] == [str(round(step / 12, 4)) if step % 12 else ""
                                                for step in range(4, 37, 4)]
    ends = [{k: v for k, v in r.items() if k not in ("seconds", "epochs_done")} for r in rows if not r["epochs_done"]]
    reference = [{k: v for k, v in r.items() if k != "seconds"}
                 for r in csv.DictReader(open(tmp_path / "epochs" / "metrics.csv"))]
    assert ends == reference  # the epoch ends score the same models as without the checks between them

    scores = [float(r["val_CIDEr"]) for r in rows]
    first_best = scores.index(max(scores))
    assert rows[first_best]["epochs_done"], (
        f"the best validation came at an epoch's end ({scores}): this test needs it mid-epoch")
    best = torch.load(tmp_path / "steps" / "best.pt", weights_only=True)["train_state"]
    assert best["best_score"] == pytest.approx(max(scores), abs=1e-5)
    assert best["best_step"] == best["step"] == int(rows[first_best]["step"])  # best.pt was written at that step
    assert best["best_epoch"] == int(rows[first_best]["epoch"])


def test_a_checkpoint_from_before_best_step_takes_it_from_its_history() -> None:
    from captioner.training.state import TrainState

    history = [{"epoch": epoch, "step": 12 * epoch} for epoch in (1, 2, 3)]
    state = TrainState()
    state.load({"epoch": 3, "step": 36, "best_score": 0.5, "best_epoch": 2, "history": history}, torch.device("cpu"))
    assert (state.best_epoch, state.best_step) == (2, 24)
    state.load({"epoch": 3, "step": 36, "best_score": 0.5, "best_epoch": 2, "best_step": 20, "history": history},
               torch.device("cpu"))
    assert state.best_step == 20


class Trains(Exception):
    """Raised where a resumed run would go on to train (its threads are fixed first)."""


def old_run(shapes: Path, run: Path, epoch: int, best_epoch: int, position: int = 0):
    """A config of 6 epochs and early stopping's patience 2, and a last.pt of a run stopped at `epoch` (batch
    `position` of the next), its best val score at `best_epoch`, written before finished.json was: none beside it."""
    from helpers import tiny_vocab

    from captioner.core.config import load_config
    from captioner.models.captioner import Captioner
    from captioner.models.checkpoint import save_checkpoint

    config = load_config(str(ROOT / "configs" / "shapes_lstm.yaml"),
                         [*TINY, f"data.root={shapes}", f"train.out_dir={run}", "train.epochs=6",
                          "train.early_stopping_patience=2"])
    history = [{"epoch": e, "step": 12 * e, "val_Bleu_4": 0.5 if e == best_epoch else 0.25}
               for e in range(1, epoch + 1)]
    state = {"epoch": epoch, "position": position, "step": 12 * epoch + position, "best_score": 0.5,
             "best_epoch": best_epoch, "history": history}  # no best_step: an old last.pt's history gives it
    save_checkpoint(run / "last.pt", Captioner.from_config(config, tiny_vocab()), config, optimizer={}, scheduler={},
                    train_state=state)
    return config


@pytest.mark.parametrize(("epoch", "best_epoch", "why"), [
    (6, 6, "all 6 epochs done"),
    (4, 2, "early stopping: no better val score in the 2 epochs after epoch 2"),
    (5, 1, "early stopping: no better val score in the 4 epochs after epoch 1"),  # ended as this config says
])
def test_resuming_a_run_whose_training_ended_trains_no_step(epoch: int, best_epoch: int, why: str, shapes: Path,
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """A run that ended (its epochs done, or early stopping's patience spent) before finished.json was written looks
    cut short to the sweeps, which --resume it once: it trains no step (an early-stopped run trained one more epoch),
    writes finished.json and says so in one line; last.pt is left as it was."""
    import json
    import logging

    from captioner.training import fit as fitting

    run = tmp_path / "run"
    config = old_run(shapes, run, epoch, best_epoch)
    before = (run / "last.pt").read_bytes()

    def trains(*args: object, **kwargs: object) -> None:
        raise Trains

    monkeypatch.setattr(fitting, "decide_threads", trains)
    with caplog.at_level(logging.INFO, logger="captioner.training.fit"):
        assert fitting.fit(config, resume=True) == run / "best.pt"
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("--resume:")]
    assert said == [f"--resume: {run / 'last.pt'} ended at epoch {epoch}, step {12 * epoch} ({why}): nothing to train, "
                    "finished.json written (raise train.epochs or train.early_stopping_patience to train on)"]
    assert json.loads((run / "finished.json").read_text()) == {"epoch": epoch, "step": 12 * epoch,
                                                               "best_epoch": best_epoch, "best_step": 12 * best_epoch}
    assert (run / "last.pt").read_bytes() == before


@pytest.mark.parametrize(("epoch", "best_epoch", "position"), [(3, 2, 0), (4, 2, 5), (5, 4, 0)])
def test_resuming_a_run_with_epochs_to_go_trains_on(epoch: int, best_epoch: int, position: int, shapes: Path,
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Patience left, or a last.pt in the middle of an epoch: the run goes on to train as before, no finished.json."""
    from captioner.training import fit as fitting

    def trains(*args: object, **kwargs: object) -> None:
        raise Trains

    monkeypatch.setattr(fitting, "decide_threads", trains)
    run = tmp_path / "run"
    with pytest.raises(Trains):
        fitting.fit(old_run(shapes, run, epoch, best_epoch, position), resume=True)
    assert not (run / "finished.json").exists()


def test_damaged_rng_states_are_one_line() -> None:
    """A numpy key of the wrong length (numpy raises IndexError) or a state of the wrong type: one CheckpointError."""
    from captioner.core.errors import CheckpointError

    good = rng_state()
    for damaged in ({**good, "numpy": [*good["numpy"][:1], good["numpy"][1][:10], *good["numpy"][2:]]},
                    {**good, "numpy": [*good["numpy"][:1], [1, 2], *good["numpy"][2:]]}):
        with pytest.raises(CheckpointError, match=r"^the checkpoint's random number generator states are malformed"):
            set_rng_state(damaged)
    set_rng_state(good)


# (damage to an old_run last.pt's train state and payload, in place; what the refusal says after the file's name)
DAMAGED_STATES = {
    "no train_state": (lambda s, p: p.pop("train_state"), r"no train_state \(a model's checkpoint"),
    "a train_state that is a list": (lambda s, p: p.update(train_state=[1, 2]), r"no train_state"),
    "no optimizer state": (lambda s, p: p.pop("optimizer"), r"no optimizer state"),
    "a scheduler state that is a string": (lambda s, p: p.update(scheduler="x"), r"no scheduler state"),
    "no epoch": (lambda s, p: s.pop("epoch"), r"train_state\.epoch is None, not a whole number"),
    "a negative epoch": (lambda s, p: s.update(epoch=-1), r"train_state\.epoch is -1, not a whole number"),
    "an epoch that is a string": (lambda s, p: s.update(epoch="2"), r"train_state\.epoch is '2'"),
    "an epoch that is a bool": (lambda s, p: s.update(epoch=True), r"train_state\.epoch is True"),
    "a fractional step": (lambda s, p: s.update(step=2.5), r"train_state\.step is 2\.5"),
    "a negative position": (lambda s, p: s.update(position=-1), r"train_state\.position is -1"),
    "a best_score that is a string": (lambda s, p: s.update(best_score="0.5"), r"train_state\.best_score is '0\.5', "
                                                                               r"not a number"),
    "a best_score that is NaN": (lambda s, p: s.update(best_score=float("nan")), r"train_state\.best_score is nan"),
    "a history that is a string": (lambda s, p: s.update(history="x"), r"train_state\.history is a str"),
    "a history row without its epoch": (lambda s, p: s.update(history=[{}]), r"train_state\.history\[0\] is \{\}"),
    "a history cell that is a string": (lambda s, p: s["history"][0].update(val_Bleu_4="a"),
                                        r"train_state\.history\[0\] is"),
    "step losses that are a number": (lambda s, p: s.update(step_losses=5), r"train_state\.step_losses is a int"),
    "a step loss without its loss": (lambda s, p: s.update(step_losses=[[1]]), r"train_state\.step_losses\[0\]"),
    "sums that are a string": (lambda s, p: s.update(running="x"), r"train_state\.running is x, not a tensor"),
}


@pytest.mark.parametrize("case", DAMAGED_STATES)
def test_a_damaged_last_pt_is_refused_in_one_line_before_the_run_writes(case: str, shapes: Path,
                                                                        tmp_path: Path) -> None:
    """--resume from a last.pt whose train state has a field of the wrong type or out of range, or that lacks its
    optimizer or scheduler state: one line naming the file and the field, before the run writes anything into its
    folder (config.yaml, vocab.json, finished.json), not a traceback from deep in the training loop."""
    from captioner.core.errors import CheckpointError
    from captioner.models.checkpoint_format import read_checkpoint, write_checkpoint_file
    from captioner.training import fit as fitting

    run = tmp_path / "run"
    config = old_run(shapes, run, 3, 2)
    payload = read_checkpoint(run / "last.pt")
    damage, said = DAMAGED_STATES[case]
    damage(payload["train_state"] if isinstance(payload.get("train_state"), dict) else {}, payload)
    write_checkpoint_file(payload, run / "last.pt")
    before = {path.name: path.read_bytes() for path in run.iterdir()}
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(run / 'last.pt'))}: {said}"):
        fitting.fit(config, resume=True)
    assert {path.name: path.read_bytes() for path in run.iterdir()} == before


def test_a_mid_epoch_checkpoint_of_an_objective_with_its_own_logged_values_resumes(shapes: Path, tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch
                                                                                   ) -> None:
    """An SCST stage's mid-epoch last.pt sums its own logged values (more than cross-entropy's three): --resume goes
    on to train it, where the check of whether the run had ended copied them into cross-entropy's sums and failed."""
    from captioner.models.checkpoint_format import read_checkpoint, write_checkpoint_file
    from captioner.training import fit as fitting
    from captioner.training.scst import SelfCritical

    run = tmp_path / "run"
    config = old_run(shapes, run, 3, 2, position=5)
    payload = read_checkpoint(run / "last.pt")
    sums = torch.ones(len(SelfCritical.logged))
    payload["train_state"] |= {"running": sums, "epoch_sums": sums, "running_steps": 2, "epoch_steps": 5}
    write_checkpoint_file(payload, run / "last.pt")

    def trains(*args: object, **kwargs: object) -> None:
        raise Trains

    monkeypatch.setattr(fitting, "decide_threads", trains)
    with pytest.raises(Trains):
        fitting.fit(config, resume=True)


def test_sums_of_other_logged_values_than_the_runs_are_one_line() -> None:
    from captioner.core.errors import CheckpointError
    from captioner.training.state import TrainState

    saved = {"epoch": 1, "step": 15, "position": 3, "best_score": 0.5, "best_epoch": 1, "running": torch.zeros(5),
             "epoch_sums": torch.zeros(5), "running_steps": 3, "epoch_steps": 3}
    with pytest.raises(CheckpointError, match=r"^runs/last\.pt: train_state\.running holds tensor\(.*\), where this "
                                              r"run sums 3 values \(loss, xent, penalty\)$"):
        TrainState().load(saved, torch.device("cpu"), "runs/last.pt")


@pytest.mark.parametrize(("part", "said"), [
    ("vocab", r"its vocab is damaged \(vocabulary must start with <pad>"),
    ("model", r"weights do not match the model its config describes \(1 missing, 0 unexpected, e\.g\. "),
])
def test_a_last_pt_with_damaged_words_or_weights_is_one_line(part: str, said: str, shapes: Path,
                                                            tmp_path: Path) -> None:
    from captioner.core.errors import CheckpointError
    from captioner.models.checkpoint_format import read_checkpoint, write_checkpoint_file
    from captioner.training import fit as fitting

    run = tmp_path / "run"
    config = old_run(shapes, run, 3, 2)
    payload = read_checkpoint(run / "last.pt")
    if part == "vocab":
        payload["vocab"] = payload["vocab"][2:]
    else:
        payload["model"].pop(next(iter(payload["model"])))
    write_checkpoint_file(payload, run / "last.pt")
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(run / 'last.pt'))}: {said}"):
        fitting.fit(config, resume=True)


def test_an_optimizer_state_that_does_not_fit_is_one_line(shapes: Path, tmp_path: Path) -> None:
    """A last.pt whose optimizer state is not the one its model trained with (empty here): one line naming it."""
    from captioner.core.errors import CheckpointError
    from captioner.training import fit as fitting

    from captioner.models.checkpoint_format import read_checkpoint, write_checkpoint_file

    run = tmp_path / "run"
    config = old_run(shapes, run, 3, 2)  # optimizer={}: no param_groups
    payload = read_checkpoint(run / "last.pt")
    payload["train_state"] |= {"cpu_bf16": False, "onednn_products": False}  # as recorded: nothing timed
    write_checkpoint_file(payload, run / "last.pt")
    config.train.cpu_amp = "fp32"
    config.train.log_every = 7  # another setting than the run's: its config.yaml must not take it on a refusal
    before = {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()}
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(run / 'last.pt'))}: its optimizer state does not "
                                              r"fit this run's \('param_groups'\); --resume cannot go on from it$"):
        fitting.fit(config, resume=True)
    assert {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()} == before
