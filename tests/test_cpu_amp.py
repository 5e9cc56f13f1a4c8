"""`train.cpu_amp`: the precision of a CPU run's steps (fp32, bf16, or auto: bf16 where the CPU
multiplies bf16 natively and a calibration on the run's shapes times it faster), decided before
the first step, never from the run's own steps or random streams, and the same for every step."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import WORDS, tiny_config, tiny_model
from torch.utils.data import DataLoader

import captioner.training.loop as loop
import captioner.training.speed as precision
from captioner.core.config import config_from_dict
from captioner.core.errors import ConfigError
from captioner.data.batching import CaptionDataset, EpochBatchSampler, collate_captions, rank_batch
from captioner.data.image_transform import ImageTransform
from captioner.data.records import ImageRecord
from captioner.training.distributed import Distributed
from captioner.training.run_setup import RunData, decide_speed, make_scheduler
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


def step_dtypes(folder: Path, bf16: bool | None, *overrides: str) -> list[torch.dtype]:
    """The dtype of the logits of each step that `train_one_epoch` runs with the train state's
    precision `bf16`, and check the step leaves fp32 weights behind."""
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

    state = TrainState(bf16=bf16)
    state.reset_sums(CPU)
    loop.train_one_epoch(model, model, loader, optimizer, make_scheduler(optimizer, config, 2), config,
                         Distributed(CPU), 1, state, None, objective)
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())
    return seen


def test_every_step_runs_in_the_precision_decided_before_the_first(tmp_path: Path) -> None:
    assert step_dtypes(tmp_path, True) == [torch.bfloat16] * 2
    assert step_dtypes(tmp_path, False) == [torch.float32] * 2
    assert step_dtypes(tmp_path, None) == [torch.float32] * 2  # nothing decided: fp32 on the CPU
    assert step_dtypes(tmp_path, None, "train.amp=true") == [torch.float32] * 2  # train.amp is CUDA's


def test_cpu_amp_takes_its_three_values_and_reads_old_booleans() -> None:
    assert tiny_config().train.cpu_amp == "fp32"
    assert [tiny_config(f"train.cpu_amp={v}").train.cpu_amp for v in ("fp32", "bf16", "auto")] == ["fp32",
                                                                                                   "bf16", "auto"]
    # Configs and checkpoints from before the three values said true (bf16 where it pays) or false.
    assert [tiny_config(f"train.cpu_amp={v}").train.cpu_amp for v in ("true", "false", "on", "off")] == ["auto", "fp32",
                                                                                                         "auto", "fp32"]
    assert config_from_dict({"train": {"cpu_amp": True}}).train.cpu_amp == "auto"
    with pytest.raises(ConfigError, match=r"'train.cpu_amp' must be one of fp32, auto, bf16; got 'fp16'"):
        tiny_config("train.cpu_amp=fp16")


def test_fp32_and_bf16_are_forced_anywhere_and_auto_needs_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model()
    monkeypatch.setattr(precision, "time_precisions",
                        lambda *a, **k: pytest.fail("calibrated where nothing was to decide"))
    for native in (True, False):
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native)
        assert precision.choose_cpu_bf16(tiny_config("train.cpu_amp=bf16"), model, False, None).bf16 is True
        assert precision.choose_cpu_bf16(tiny_config("train.cpu_amp=fp32"), model, False, None).bf16 is False
    choice = precision.choose_cpu_bf16(tiny_config("train.cpu_amp=auto"), model, False, None)
    assert choice.bf16 is False and "no native bf16" in choice.reason


def test_auto_calibrates_once_per_machine_and_shapes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    calls: list[int] = []

    def timed(model, config, encoded, feature_shape, batch=None):
        calls.append(config.data.batch_size)
        return {"bf16": config.data.batch_size == 8, "bf16_ms": 1.0, "fp32_ms": 2.0}

    monkeypatch.setattr(precision, "time_precisions", timed)
    model = tiny_model()
    small, large = tiny_config("train.cpu_amp=auto", "data.batch_size=4"), tiny_config("train.cpu_amp=auto",
                                                                                       "data.batch_size=8")
    assert precision.choose_cpu_bf16(small, model, False, None).bf16 is False
    assert precision.choose_cpu_bf16(small, model, False, None).bf16 is False  # recalled: not timed again
    assert precision.choose_cpu_bf16(large, model, False, None).bf16 is True  # other shapes: their own calibration
    assert calls == [4, 8]
    assert precision.machine_would_choose(large, False, None) is True
    assert precision.machine_would_choose(tiny_config("train.cpu_amp=auto", "data.batch_size=16"), False, None) is None


def test_a_calibration_that_ties_in_its_kept_times_keeps_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 faster by 3 microseconds, both 16.06 ms once rounded: the decision is the one the kept times show.
    Before, bf16 was taken while its kept time was no faster than fp32's."""
    starts_and_ends = iter([0.0, 0.0,  # the warm-up round: fp32, then bf16, started and not timed
                            0.0, 0.016061, 1.0, 1.016058])  # the timed round: fp32, then bf16
    monkeypatch.setattr(precision, "time", SimpleNamespace(perf_counter=starts_and_ends.__next__))
    decision = precision.time_precisions(tiny_model().train(), tiny_config("data.batch_size=2"), False, None, steps=1)
    assert decision == {"bf16": False, "bf16_ms": 16.06, "fp32_ms": 16.06}


def test_a_ranks_batch_is_what_the_sampler_gives_it() -> None:
    """`rank_batch`, which sizes the calibration's batch, is the size of every batch each rank's sampler yields."""
    for size, batch_size, world_size in [(64, 8, 1), (5, 1000, 1), (5, 1000, 2), (7, 3, 2), (3, 2, 4)]:
        for rank in range(world_size):
            sampler = EpochBatchSampler(size, batch_size, 0, rank, world_size)
            assert {len(b) for b in sampler} == {rank_batch(size, batch_size, world_size)}, (size, batch_size, rank)


def test_the_calibration_times_the_batch_a_step_takes_not_a_larger_configured_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """data.batch_size 1000 over 3 training images: every step holds 3, and so does the calibration's batch.
    Before, it built 1000 synthetic images (a batch size past the data's exhausted memory, killed or a traceback)."""
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    sizes: list[int] = []
    original = precision.synthetic_batch

    def synthetic(*args: object, **kwargs: object):
        made = original(*args, **kwargs)
        sizes.append(made.images.shape[0])
        return made

    monkeypatch.setattr(precision, "synthetic_batch", synthetic)
    config = tiny_config("train.cpu_amp=auto", "data.batch_size=1000", "train.device=cpu")
    data = RunData([ImageRecord(i, Path(f"{i}.png"), ("a red circle",)) for i in range(3)], [])
    speed = decide_speed(config, Distributed(CPU), tiny_model(), TrainState(), data, None, 1)
    assert sizes == [3] and speed.bf16 == precision.machine_would_choose(config, False, None, 3)


def test_a_calibration_without_memory_is_one_line_and_decides_nothing(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    """No precision is taken for want of memory (the run's weights would hang on it): one line, nothing kept."""
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)

    def no_memory(*args: object, **kwargs: object) -> dict:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 98304000000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(precision, "time_precisions", no_memory)
    config = tiny_config("train.cpu_amp=auto", "data.batch_size=64")
    with pytest.raises(ConfigError, match=r"^train\.cpu_amp auto: a step of 16 images found no memory to run in "
                                          r"\(.*can't allocate memory.*\); lower data\.batch_size, or set "
                                          r"train\.cpu_amp to fp32 or bf16$"):
        precision.choose_cpu_bf16(config, tiny_model(), False, None, 16)
    assert precision.machine_would_choose(config, False, None, 16) is None
    monkeypatch.setattr(precision, "time_precisions", lambda *a, **k: 1 / 0)  # any other failure is a bug: kept
    with pytest.raises(ZeroDivisionError):
        precision.choose_cpu_bf16(config, tiny_model(), False, None, 16)


@pytest.mark.parametrize("encoded", [False, True])
def test_the_calibration_draws_nothing_from_the_run_and_changes_no_weight(encoded: bool) -> None:
    """It times a copy over synthetic batches: the global generator, the model's weights and its
    batch-norm statistics are as they were, and both precisions were timed."""
    model = tiny_model().train()
    config = tiny_config("data.batch_size=2", "model.decoder.dropout=0.5")
    with torch.no_grad():
        # (N, D)
        feature_shape = tuple(
            model.encoder.eval()(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))[0].shape[1:]) if encoded else None
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    decision = precision.time_precisions(model, config, encoded, feature_shape, steps=1)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert decision["bf16"] == (decision["bf16_ms"] < decision["fp32_ms"]) and decision["fp32_ms"] > 0


def test_a_run_decides_before_its_first_step_and_records_the_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """`fit` with auto on a CPU with native bf16: the calibration runs once, before training; every
    step then runs in its choice, which last.pt records; a second run of the config recalls it."""
    from captioner.data.shapes import generate_shapes
    from captioner.training.fit import fit

    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    calls: list[int] = []
    monkeypatch.setattr(precision, "time_precisions",
                        lambda *a, **k: calls.append(1) or {"bf16": True, "bf16_ms": 1.0, "fp32_ms": 2.0})
    dtypes: list[torch.dtype] = []
    original = loop.caption_loss

    def caption_loss(model, batch, config, encoded, totals=None, forward=None):
        dtypes.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32)
        return original(model, batch, config, encoded, totals, forward)

    monkeypatch.setattr("captioner.training.run_setup.caption_loss", caption_loss)
    generate_shapes(tmp_path / "shapes", 8, 2, 1, image_size=32, seed=0, progress=False)
    overrides = ["data.batch_size=4", "train.epochs=1", "train.device=cpu", "train.val_max_images=2",
                 "decode.max_length=6",
                 f"data.root={tmp_path / 'shapes'}", "train.cpu_amp=auto"]
    for run in ("a", "b"):
        with caplog.at_level("DEBUG", logger="captioner.training.run_setup"):
            fit(tiny_config(*overrides, f"train.out_dir={tmp_path / run}"))
        saved = torch.load(tmp_path / run / "last.pt", weights_only=True)["train_state"]
        assert saved["cpu_bf16"] is True and saved["threads"] == torch.get_num_threads()
    assert calls == [1] and dtypes == [torch.bfloat16] * 4  # 2 steps a run, all bf16; timed once
    assert any(r.getMessage().startswith("steps in bf16, 1 thread") for r in caplog.records)
