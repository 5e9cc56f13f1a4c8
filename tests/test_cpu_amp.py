"""`train.cpu_amp`: training steps under bf16 autocast on a CPU that multiplies bf16 natively,
fp32 elsewhere; the switch reaches the step that `train_one_epoch` runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import WORDS, tiny_config, tiny_model
from torch.utils.data import DataLoader

import captioner.training.loop as loop
from captioner.data.batching import CaptionDataset, collate_captions
from captioner.data.images import ImageTransform
from captioner.data.records import ImageRecord
from captioner.training.distributed import Distributed
from captioner.training.schedule import make_scheduler
from captioner.training.state import TrainState

CPU = torch.device("cpu")


def records(folder: Path, n: int = 4) -> list[ImageRecord]:
    from PIL import Image

    out = []
    for i in range(n):
        path = folder / f"{i}.png"
        Image.new("RGB", (32, 32), (60 * i % 255, 90, 30)).save(path)
        out.append(ImageRecord(i, path, (" ".join(WORDS[i : i + 4]),)))
    return out


def step_dtypes(folder: Path, *overrides: str) -> list[torch.dtype]:
    """The dtype of the logits of each step that `train_one_epoch` runs, and check the step
    leaves fp32 weights behind."""
    config = tiny_config("data.batch_size=2", "train.device=cpu", *overrides)
    model = tiny_model().train()
    dataset = CaptionDataset(records(folder), model.vocab, ImageTransform(32, train=True), 20, "one")
    loader = DataLoader(dataset, batch_size=2, collate_fn=collate_captions)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seen: list[torch.dtype] = []

    def objective(model, batch, config, encoded, totals, forward):
        loss, parts = loop.caption_loss(model, batch, config, encoded, totals, forward)
        out = model(batch.images, batch.tokens[:, :-1], batch.image_rows, lengths=batch.lengths - 1)
        seen.append(out.logits.dtype)
        return loss, parts

    state = TrainState()
    state.reset_sums(CPU)
    loop.train_one_epoch(model, model, loader, optimizer, make_scheduler(optimizer, config, 2), config,
                         Distributed(CPU), 1, state, None, objective)
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())
    return seen


def test_cpu_amp_runs_the_steps_in_bf16_on_a_cpu_with_native_bf16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "cpu_has_native_bf16", lambda: True)
    assert step_dtypes(tmp_path, "train.cpu_amp=true") == [torch.bfloat16] * 2
    assert step_dtypes(tmp_path, "train.cpu_amp=false") == [torch.float32] * 2


def test_cpu_amp_is_ignored_where_bf16_would_be_emulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "cpu_has_native_bf16", lambda: False)
    assert step_dtypes(tmp_path, "train.cpu_amp=true") == [torch.float32] * 2


def test_amp_alone_is_a_cuda_setting() -> None:
    config = tiny_config("train.amp=true", "train.cpu_amp=false")
    assert loop.bf16_autocast(config, torch.device("cuda")) is True
    assert loop.bf16_autocast(config, CPU) is False
    assert loop.bf16_autocast(tiny_config("train.amp=false", "train.cpu_amp=true"), torch.device("cuda")) is False


# --- bf16 chosen by timing it on this CPU (training/precision.py) -----------------------------------


def test_the_trial_alternates_then_keeps_the_faster(caplog: pytest.LogCaptureFixture) -> None:
    from captioner.training.precision import PrecisionTrial

    for bf16_seconds, winner in ((0.4, True), (0.7, False)):
        trial = PrecisionTrial(steps=8)
        seen = []
        with caplog.at_level("INFO", logger="captioner.training.precision"):
            while trial.decided is None:
                bf16 = trial.bf16_now()
                seen.append(bf16)
                trial.record(bf16, bf16_seconds if bf16 else 0.5)
        assert seen == [False, True] * 4 and trial.decided is winner
        assert all(trial.bf16_now() is winner for _ in range(3)) and trial.record(winner, 9.0) is None
        assert len(trial.times[True]) == len(trial.times[False]) == 3  # each precision's first step is a warm-up
        assert caplog.records[-1].getMessage().endswith("bf16 steps from here" if winner else "fp32 steps from here")


def test_a_warm_up_step_does_not_decide() -> None:
    from captioner.training.precision import PrecisionTrial

    trial = PrecisionTrial(steps=4)
    for bf16, seconds in ((False, 0.5), (True, 60.0), (False, 0.5), (True, 0.3)):  # bf16's first step: kernels chosen
        trial.record(bf16, seconds)
    assert trial.decided is True


def test_the_first_steps_of_a_run_time_both_and_the_state_keeps_the_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """train_one_epoch runs each step in the trial's precision, and the decision lands in the
    train state (saved with last.pt, so a resumed run keeps it)."""
    from captioner.training.precision import PrecisionTrial

    monkeypatch.setattr(loop, "cpu_has_native_bf16", lambda: True)
    config = tiny_config("data.batch_size=1", "train.device=cpu", "train.cpu_amp=true")
    model = tiny_model().train()
    dataset = CaptionDataset(records(tmp_path, n=6), model.vocab, ImageTransform(32, train=True), 20, "one")
    loader = DataLoader(dataset, batch_size=1, collate_fn=collate_captions)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seen: list[torch.dtype] = []

    def objective(model, batch, config, encoded, totals, forward):
        loss, parts = loop.caption_loss(model, batch, config, encoded, totals, forward)
        seen.append(model(batch.images, batch.tokens[:, :-1], batch.image_rows, lengths=batch.lengths - 1).logits.dtype)
        return loss, parts

    state = TrainState()
    state.reset_sums(CPU)
    state.precision = trial = PrecisionTrial(steps=4)
    loop.train_one_epoch(model, model, loader, optimizer, make_scheduler(optimizer, config, 6), config,
                         Distributed(CPU), 1, state, None, objective)
    assert seen[:4] == [torch.float32, torch.bfloat16, torch.float32, torch.bfloat16]
    assert state.cpu_bf16 is trial.decided is not None
    assert seen[4:] == [torch.bfloat16 if trial.decided else torch.float32] * 2
    import statistics

    assert trial.decided == (statistics.median(trial.times[True]) < statistics.median(trial.times[False]))
    restored = TrainState()
    restored.load(state.to_dict(), CPU)
    assert restored.cpu_bf16 is state.cpu_bf16
