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
