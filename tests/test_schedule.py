"""Learning-rate schedules in epochs (the same on 1 and 8 GPUs) and the explicit lr scaling rule."""

from __future__ import annotations

import math

import pytest
import torch

from captioner.core.config import load_config
from captioner.core.errors import ConfigError
from captioner.training.run_setup import describe_schedule, lr_scale, make_scheduler

LR = 1e-3


def lrs(steps_per_epoch: int, *overrides: str) -> list[float]:
    """The decoder's learning rate at every optimiser step of a whole run."""
    config = load_config(None, [f"train.lr={LR}", "train.epochs=3", *overrides])
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = make_scheduler(optimizer, config, steps_per_epoch)
    rates = []
    for _ in range(config.train.epochs * steps_per_epoch):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def by_epochs(rates: list[float], steps_per_epoch: int) -> dict[float, float]:
    """lr of each step, keyed by the epochs done after it."""
    return {round((step + 1) / steps_per_epoch, 9): lr for step, lr in enumerate(rates)}


def expected(epochs_done: float, warmup: float, epochs: int = 3) -> float:
    """Linear warmup to LR over `warmup` epochs, then cosine to 5% of LR at the run's end."""
    if epochs_done <= warmup:
        return LR * epochs_done / warmup
    return LR * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (epochs_done - warmup) / (epochs - warmup))))


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
def test_warmup_in_epochs_is_the_same_function_of_epochs_on_1_and_8_ranks(schedule: str) -> None:
    """80 steps an epoch on one GPU, 10 on eight (the global batch is 8x): the lr of every
    8-rank step equals the 1-rank lr at the same point of the run, and both follow the formula."""
    one, eight = (lrs(n, "train.warmup_epochs=0.5", f"train.schedule={schedule}") for n in (80, 10))
    one_by_epoch, eight_by_epoch = by_epochs(one, 80), by_epochs(eight, 10)
    assert len(eight_by_epoch) == 30 and eight_by_epoch.keys() <= one_by_epoch.keys()
    for epochs_done, lr in eight_by_epoch.items():
        assert lr == pytest.approx(one_by_epoch[epochs_done], rel=1e-12), epochs_done
    for epochs_done, lr in one_by_epoch.items():
        formula = expected(epochs_done, 0.5) if schedule == "cosine" else LR * min(1.0, epochs_done / 0.5)
        assert lr == pytest.approx(formula, rel=1e-12), epochs_done
    assert one[-1] == pytest.approx(0.05 * LR if schedule == "cosine" else LR)


def test_warmup_in_steps_is_not_the_same_on_8_ranks() -> None:
    """What the epochs fix: 40 warmup steps are half an epoch on one GPU, four on eight."""
    one, eight = lrs(80, "train.warmup_steps=40"), lrs(10, "train.warmup_steps=40")
    assert max(one[:40]) == pytest.approx(LR) and max(eight) < LR  # the 8-rank run never leaves its warmup


def test_neither_set_keeps_the_old_default_of_100_steps_and_both_set_is_an_error() -> None:
    assert lrs(80)[99] == pytest.approx(LR) and lrs(80)[98] == pytest.approx(LR * 99 / 100)
    assert lrs(80, "train.warmup_steps=0", "train.schedule=constant")[0] == pytest.approx(LR)  # no warmup
    with pytest.raises(ConfigError, match=(r"'train.warmup_epochs' \(0.5\) and 'train.warmup_steps' \(40\) are both "
                                           r"set; keep one and set the other to null")):
        load_config(None, ["train.warmup_epochs=0.5", "train.warmup_steps=40"])


@pytest.mark.parametrize(
    "overrides, global_batch, scale",
    [
        ([], 256, 1.0),  # none: the lrs as written, whatever the batch
        (["train.lr_scaling=linear"], 512, 8.0),  # base: data.batch_size (64), one process's batch
        (["train.lr_scaling=linear", "train.base_batch=32"], 256, 8.0),
        (["train.lr_scaling=sqrt", "train.base_batch=32"], 512, 4.0),
        (["train.lr_scaling=linear", "train.base_batch=256"], 64, 0.25),
    ],
)
def test_lr_scaling_rule(overrides: list[str], global_batch: int, scale: float) -> None:
    config = load_config(None, ["data.batch_size=64", *overrides])
    assert lr_scale(config, global_batch) == pytest.approx(scale)


def test_the_rule_and_warmup_are_logged_in_one_line() -> None:
    config = load_config(None,
                         ["train.lr=4e-4", "train.encoder_lr=1e-4", "train.lr_scaling=linear", "train.base_batch=32",
                                "train.warmup_epochs=0.28"])
    assert describe_schedule(config, 256, 443) == (
        "lr 0.0004, encoder_lr 0.0001 x 8 (linear scaling: global batch 256 / base batch 32); "
        "warmup 124 steps = 0.28 epochs, then cosine"
    )
    config = load_config(None, ["train.warmup_steps=0", "train.schedule=constant"])
    assert describe_schedule(config, 64, 10).startswith(
        "lr 0.0004, encoder_lr 0.0001 as configured (train.lr_scaling none); warmup 0 steps")
