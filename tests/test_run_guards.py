"""What a training run refuses or warns of as it starts, called from Python as well as from `captioner train`: an
earlier run in its folder without resume, and a thread count past any machine's or past this process's cores."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import tiny_config

from captioner.core.config import load_config
from captioner.core.config_sections import Config
from captioner.core.errors import ConfigError
from captioner.data.shapes import generate_shapes
from captioner.models.checkpoint_format import read_checkpoint
from captioner.training import fit as fitting
from captioner.training.distributed import Distributed


def shapes(root: Path, train: int = 8, seed: int = 0) -> Path:
    generate_shapes(root, train, 4, 2, image_size=32, seed=seed, progress=False)
    return root


def run_config(data: Path, run: Path, *extra: str) -> Config:
    """Two steps an epoch on 8 images, two val images decoded: a second or so."""
    return tiny_config(f"data.root={data}", f"train.out_dir={run}", "data.batch_size=4", "train.epochs=1",
                       "train.device=cpu", "train.val_max_images=2", "decode.max_length=6", "train.cpu_amp=fp32",
                       "train.early_stopping_patience=0", *extra)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the shapes world, a run of one epoch on it), for each test to copy."""
    root = tmp_path_factory.mktemp("trained")
    data = shapes(root / "shapes")
    fitting.fit(run_config(data, root / "run"))
    return data, root / "run"


def copied(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


def files(run: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()}


def refuse(what: str):
    def stop(*args: object, **kwargs: object) -> None:
        raise AssertionError(what)

    return stop


def test_fit_from_python_refuses_an_earlier_run_and_resume_continues_it(
    trained: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`fit(config)` wrote its checkpoints over an earlier run's in train.out_dir: refused in the command's words
    before any data is read, every file left as it was. `fit(config, resume=True)` continues that run."""
    data, run = trained
    mine = copied(run, tmp_path / "run")
    before = files(mine)
    with monkeypatch.context() as reading:
        reading.setattr(fitting, "load_records", refuse("fit read its data before refusing"))
        with pytest.raises(ConfigError, match=(rf"^train\.out_dir={mine} already holds a run \(best\.pt, last\.pt\): "
                                               r"continue it with --resume, or give another train\.out_dir "
                                               r"\(or delete it\)$")):
            fitting.fit(run_config(data, mine, "train.epochs=2"))
    assert files(mine) == before
    fitting.fit(run_config(data, mine, "train.epochs=2"), resume=True)
    assert read_checkpoint(mine / "last.pt")["train_state"]["epoch"] == 2


class Rank(Distributed):
    """A rank of two whose broadcast hands it `rank_0_sent` (rank 0's object), and keeps what it offered."""

    def __init__(self, rank: int, rank_0_sent: object = None) -> None:
        super().__init__(torch.device("cpu"), rank, 2)
        object.__setattr__(self, "sent", rank_0_sent)
        object.__setattr__(self, "offered", [])

    def broadcast(self, obj: object) -> object:
        self.offered.append(obj)
        return obj if self.is_main else self.sent


def test_every_rank_stops_with_rank_0s_refusal_of_an_earlier_run(tmp_path: Path) -> None:
    """Under torchrun rank 0 alone looks at the run folder; it sends its refusal to every rank, so none is left
    waiting in a collective for a rank that has left: each raises the same line."""
    from captioner.training.run_folders import check_run_start

    (tmp_path / "last.pt").write_bytes(b"an earlier run")
    config = tiny_config(f"train.out_dir={tmp_path}")
    rank_0 = Rank(0)
    with pytest.raises(ConfigError, match="already holds a run") as said:
        check_run_start(config, False, rank_0)
    assert rank_0.offered == [said.value]
    other = Rank(1, rank_0_sent=said.value)
    elsewhere = tiny_config(f"train.out_dir={tmp_path / 'empty'}")  # its own view of the folder is not asked
    with pytest.raises(ConfigError, match="already holds a run"):
        check_run_start(elsewhere, False, other)
    assert other.offered == [None]
    check_run_start(config, True, Rank(0))  # resumed: the run is what it continues


def test_train_threads_beyond_any_machines_cores_are_refused_in_one_line() -> None:
    assert load_config(None, ["train.threads=1024"]).train.threads == 1024
    with pytest.raises(ConfigError, match=r"'train\.threads' must be .*in \[0, 1024\]; got 1025$"):
        load_config(None, ["train.threads=1025"])


def test_threads_beyond_the_cores_this_process_may_use_are_kept_and_warned_of(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A config travels between machines, and another count would give other weights: 8 threads on 2 usable
    cores stay 8, with one warning naming the cores; so does a resumed run's recorded 8."""
    from captioner.training.speed import decide_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    before = torch.get_num_threads()
    try:
        with caplog.at_level("WARNING", logger="captioner.training.speed"):
            assert decide_threads(tiny_config("train.threads=8"), None, "last.pt") == (8, None)
            assert torch.get_num_threads() == 8
            assert [r.getMessage() for r in caplog.records] == [
                "threads: 8 (train.threads), more than the 2 cores this process may use: its steps will be slower "
                "than with 2 threads; set train.threads=2 for speed (the weights then differ)"]
            caplog.clear()
            assert decide_threads(tiny_config("train.threads=2"), None, "last.pt") == (2, None)
            assert caplog.records == []
            monkeypatch.delenv("CAPTIONER_THREADS", raising=False)
            monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
            assert decide_threads(tiny_config(), {"threads": 8}, "runs/x/last.pt") == (8, None)
            assert [r.getMessage().split(", more than")[0] for r in caplog.records] == [
                "threads: 8 (as runs/x/last.pt trained with)"]
    finally:
        torch.set_num_threads(before)
