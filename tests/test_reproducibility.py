"""The reproducibility contract (docs/training.md): on one machine, the same config and seed give
the same weights bit for bit, and a run stopped at any step and resumed ends with the weights of
the run that never stopped. Both hold in fp32 steps and in bf16 steps (forced: bf16 autocast runs
on any x86 CPU, natively or emulated, so a machine without native bf16 checks that path too).

The runs are in-process and tiny (24 images, 6 steps an epoch, 2 epochs). A stop is the signal
handler's own flag, set after the chosen step, so the run saves last.pt and raises `Interrupted`
exactly as a SIGTERM makes it (tests/test_faults_signals.py sends real signals)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY_MODEL

import captioner.training.fit as fit_module
from captioner.core.config import load_config
from captioner.data.shapes import generate_shapes
from captioner.training.fit import fit
from captioner.training.loop import Interrupted

ROOT = Path(__file__).resolve().parents[1]
STEPS_PER_EPOCH = 6
EPOCHS = 2
# Dropout, one random caption per image and augmentation all draw random numbers that a resume
# must replay; the learning rate changes at every step (warmup, then cosine).
TINY = [
    *TINY_MODEL,
    "data.batch_size=4",
    "data.captions_per_image=one",
    "data.augment=true",
    "model.decoder.dropout=0.3",
    f"train.epochs={EPOCHS}",
    "train.warmup_steps=2",
    "train.log_every=1",
    "train.val_max_images=4",
    "train.early_stopping_patience=0",
    "train.device=cpu",
    "decode.max_length=8",
]
PRECISIONS = ["fp32", "bf16"]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    generate_shapes(root, 4 * STEPS_PER_EPOCH, 4, 2, image_size=32, seed=0, progress=False)
    return root


def config_for(shapes: Path, out: Path, precision: str):
    return load_config(ROOT / "configs/shapes_lstm.yaml",
                       [*TINY, f"data.root={shapes}", f"train.out_dir={out}", f"train.cpu_amp={precision}"])


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "last.pt", weights_only=True)["model"]


def assert_same_weights(expected: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    assert expected.keys() == got.keys()
    differing = [name for name, tensor in expected.items() if not torch.equal(tensor, got[name])]
    assert not differing, f"{len(differing)} tensors differ, first {differing[0]}"


@pytest.fixture(scope="module")
def reference(shapes: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One uninterrupted run per precision."""
    runs = {}
    for precision in PRECISIONS:
        runs[precision] = tmp_path_factory.mktemp(f"reference_{precision}")
        fit(config_for(shapes, runs[precision], precision))
    return runs


def stop_after(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """The run stops after `step` as if a SIGTERM had come during it."""
    original = fit_module.Run.after_step

    def after_step(self) -> None:
        original(self)
        if self.state.step == step:
            self.stop.received.setdefault(signal.SIGTERM, time.monotonic())

    monkeypatch.setattr(fit_module.Run, "after_step", after_step)


@pytest.mark.slow
@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_same_config_and_seed_give_the_same_weights(shapes: Path, reference: dict[str, Path], tmp_path: Path,
                                                        precision: str) -> None:
    fit(config_for(shapes, tmp_path, precision))
    assert_same_weights(weights(reference[precision]), weights(tmp_path))
    saved = torch.load(tmp_path / "last.pt", weights_only=True)["train_state"]
    assert saved["cpu_bf16"] is (precision == "bf16") and saved["threads"] == torch.get_num_threads()
    # The two precisions do train differently: a run that ignored train.cpu_amp would fail here.
    other = weights(reference["bf16" if precision == "fp32" else "fp32"])
    assert any(not torch.equal(t, other[name]) for name, t in weights(tmp_path).items())


@pytest.mark.slow
@pytest.mark.parametrize("precision", PRECISIONS)
# the first, mid-epoch, the epoch's last
@pytest.mark.parametrize("step", [1, STEPS_PER_EPOCH // 2 + 1, STEPS_PER_EPOCH])
def test_a_run_stopped_at_any_step_and_resumed_ends_as_the_one_that_never_stopped(
    shapes: Path, reference: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    precision: str, step: int,
) -> None:
    with monkeypatch.context() as stopping:
        stop_after(stopping, step)
        with pytest.raises(Interrupted):
            fit(config_for(shapes, tmp_path, precision))
    saved = torch.load(tmp_path / "last.pt", weights_only=True)["train_state"]
    assert saved["step"] == step and saved["cpu_bf16"] is (precision == "bf16")
    fit(config_for(shapes, tmp_path, precision), resume=True)
    assert torch.load(tmp_path / "last.pt", weights_only=True)["train_state"]["step"] == EPOCHS * STEPS_PER_EPOCH
    assert_same_weights(weights(reference[precision]), weights(tmp_path))


@pytest.mark.slow
def test_auto_resumes_in_the_precision_its_run_took_whatever_this_machine_would_take(
    shapes: Path, reference: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run trained in bf16, resumed with train.cpu_amp auto on a machine whose calibration says
    fp32 (or that has no native bf16): it goes on in bf16 and ends as the bf16 reference; one line
    says so. An explicit fp32 wins, and says the run no longer goes on bit for bit."""
    import captioner.training.speed as precision

    with monkeypatch.context() as stopping:
        stop_after(stopping, STEPS_PER_EPOCH // 2)
        with pytest.raises(Interrupted):
            fit(config_for(shapes, tmp_path / "run", "bf16"))
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)  # auto would take fp32 here
    monkeypatch.setattr(precision, "time_precisions", lambda *a, **k: pytest.fail("a resumed run calibrated"))
    with caplog.at_level("INFO", logger="captioner.training.speed"):
        fit(config_for(shapes, tmp_path / "run", "auto"), resume=True)
    assert_same_weights(weights(reference["bf16"]), weights(tmp_path / "run"))
    assert any("bf16 steps, as" in r.getMessage() and "would take fp32" in r.getMessage() for r in caplog.records)
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=True)["train_state"]["cpu_bf16"] is True


@pytest.mark.parametrize("log_every", [1, 0])
def test_a_run_whose_loss_stops_being_a_number_stops_in_one_line(shapes: Path, tmp_path: Path, log_every: int) -> None:
    """At a learning rate of 1e30 the weights go to NaN at once; the run trained on to its end and exited 0, its
    best.pt a NaN model. It stops at the first logged loss (or, logging nothing, the epoch's mean) not finite."""
    from captioner.core.errors import DivergedError

    config = load_config(ROOT / "configs/shapes_lstm.yaml",
                         [*TINY, f"data.root={shapes}", f"train.out_dir={tmp_path}", "train.cpu_amp=fp32",
                          "train.lr=1e30", "train.grad_clip=0", f"train.log_every={log_every}"])
    with pytest.raises(DivergedError, match=r"^the training loss is -?(nan|inf) by step (\d+): the weights diverged; "
                                            r"lower train\.lr \(now 1e\+30\) or set train\.grad_clip; ") as stopped:
        fit(config)
    step = int(str(stopped.value).split(" by step ")[1].split(":")[0])
    assert step == STEPS_PER_EPOCH if log_every == 0 else 1 < step < STEPS_PER_EPOCH
    assert not (tmp_path / "best.pt").exists()


def test_a_run_whose_captions_hold_no_word_it_keeps_is_refused(shapes: Path, tmp_path: Path) -> None:
    """Empty captions, or a data.min_word_count above every word's count, left a vocabulary of <pad>, <bos>, <eos>
    and <unk> alone: the run trained a model that can only end at once, and exited 0."""
    from captioner.core.errors import DatasetError

    config = load_config(ROOT / "configs/shapes_lstm.yaml",
                         [*TINY, f"data.root={shapes}", f"train.out_dir={tmp_path}", "train.cpu_amp=fp32",
                          "data.min_word_count=100000"])
    with pytest.raises(DatasetError, match=r"the training captions hold no word seen 100000 times or more "
                                           r"\(data\.min_word_count\); empty captions\?$"):
        fit(config)
    assert not (tmp_path / "last.pt").exists()
