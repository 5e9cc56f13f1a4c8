"""What a training run refuses or warns of as it starts, called from Python as well as from `captioner train`: an
earlier run in its folder without resume, a thread count past any machine's or past this process's cores, and a
--resume on other training data than its run's (the same data in another folder resumes)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import RUN_HOLDER, run_held_elsewhere, subprocess_env, tiny_config

from captioner.core.config import load_config
from captioner.core.config_sections import Config
from captioner.core.errors import CheckpointError, ConfigError, StorageError
from captioner.data.shapes import generate_shapes
from captioner.data.shards import ShardSet
from captioner.models.checkpoint_format import read_checkpoint, write_checkpoint_file
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
    from captioner.training.run_folders import run_folder_held

    (tmp_path / "last.pt").write_bytes(b"an earlier run")
    config = tiny_config(f"train.out_dir={tmp_path}")
    rank_0 = Rank(0)
    with pytest.raises(ConfigError, match="already holds a run") as said, run_folder_held(config, False, rank_0):
        pass
    assert rank_0.offered == [said.value]
    other = Rank(1, rank_0_sent=said.value)
    elsewhere = tiny_config(f"train.out_dir={tmp_path / 'empty'}")  # its own view of the folder is not asked
    with pytest.raises(ConfigError, match="already holds a run"), run_folder_held(elsewhere, False, other):
        pass
    assert other.offered == [None]
    assert not (tmp_path / "empty").exists()  # rank 0 alone makes the run folder
    with run_folder_held(config, True, Rank(0)):  # resumed: the run is what it continues
        pass


def tries(run: Path) -> str:
    """What another process trying to hold `run` says: "held" when it is free, else its refusal."""
    done = subprocess.run([sys.executable, "-c", RUN_HOLDER.replace("time.sleep(600)", ""), str(run)],
                          capture_output=True, text=True, env=subprocess_env())
    return done.stdout.strip()


def test_a_run_into_a_folder_another_run_trains_in_is_refused_and_a_killed_one_frees_it(
    trained: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, a second `captioner train` into the folder (the command started twice, or a job started again while
    the first ran) trained beside the first, each writing its last.pt and step losses over the other's. Now it is
    refused in one line naming the process, before any data is read; the lock goes with the process however it
    ends, so a SIGKILLed run resumes at once."""
    data, run = trained
    mine = copied(run, tmp_path / "run")
    before = files(mine)
    with run_held_elsewhere(mine) as first, monkeypatch.context() as reading:
        busy = (rf"^train\.out_dir={mine}: another training run \(process {first.pid}\) is writing into this folder; "
                r"wait for it to end, or give another train\.out_dir$")
        reading.setattr(fitting, "load_records", refuse("fit read its data before refusing"))
        with pytest.raises(StorageError, match=busy):
            fitting.fit(run_config(data, mine, "train.epochs=2"), resume=True)
        (tmp_path / "again").symlink_to(mine)  # the same folder under another name
        with pytest.raises(StorageError, match=busy.replace(str(mine), str(tmp_path / "again"))):
            fitting.fit(run_config(data, tmp_path / "again", "train.epochs=2"), resume=True)
    assert files(mine) == before
    fitting.fit(run_config(data, mine, "train.epochs=2"), resume=True)
    assert read_checkpoint(mine / "last.pt")["train_state"]["epoch"] == 2


def test_fit_holds_its_run_folder_while_it_trains_and_frees_it_when_it_ends(
    trained: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new run into an empty folder is held from before its first step to its end, and by this process alone
    (not by the data loader's workers, which could outlive it), then free for the next."""
    data, _ = trained
    seen: list[str] = []
    train = fitting.Run.train
    monkeypatch.setattr(fitting.Run, "train", lambda run: (seen.append(tries(tmp_path / "run")), train(run))[1])
    fitting.fit(run_config(data, tmp_path / "run", "data.num_workers=1"))
    assert seen == [f"train.out_dir={tmp_path / 'run'}: another training run (process {os.getpid()}) is writing into "
                    "this folder; wait for it to end, or give another train.out_dir"]
    assert tries(tmp_path / "run") == "held"


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


@pytest.mark.parametrize("other", ["more images", "other captions"])
def test_resume_refuses_other_training_data_before_any_step(trained: tuple[Path, Path], tmp_path: Path,
                                                            other: str) -> None:
    """A resumed run must end as the one that never stopped: on another data set it cannot, and it said
    nothing. The line names the checkpoint, the data and what differs; last.pt is left as it was."""
    _, run = trained
    mine = copied(run, tmp_path / "run")
    before = files(mine)
    data = shapes(tmp_path / "other", 12) if other == "more images" else shapes(tmp_path / "other", seed=1)
    differs = (r"8 training images, data\.root=.*other has 12" if other == "more images" else
               r"other data than data\.root=.*other holds \(the same 8 training images, other ids or captions, or "
               r"in another order\)")
    with pytest.raises(CheckpointError, match=(rf"^--resume: {mine / 'last.pt'} was trained on {differs}: resume "
                                               r"with the same data, or start a new run$")):
        fitting.fit(run_config(data, mine, "train.epochs=2"), resume=True)
    assert files(mine) == before


def test_resume_takes_the_same_data_moved_elsewhere(trained: tuple[Path, Path], tmp_path: Path) -> None:
    """A data folder moves (another node mounts it elsewhere): the run resumes on it, whatever data.root says."""
    data, run = trained
    mine = copied(run, tmp_path / "run")
    moved = Path(shutil.move(copied(data, tmp_path / "data"), tmp_path / "mounted" / "elsewhere"))
    fitting.fit(run_config(moved, mine, "train.epochs=2"), resume=True)
    saved = read_checkpoint(mine / "last.pt")["train_state"]
    assert saved["epoch"] == 2 and saved["data"] == read_checkpoint(run / "last.pt")["train_state"]["data"]


def test_a_checkpoint_that_recorded_no_data_resumes_and_records_them(trained: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    """A last.pt written before the data were recorded has nothing to compare: it resumes, on any data, and
    the resumed run's last.pt records them."""
    _, run = trained
    mine = copied(run, tmp_path / "run")
    old = read_checkpoint(mine / "last.pt")
    del old["train_state"]["data"]
    (mine / "last.pt").unlink()  # a hard link to best.pt, maybe: written anew alone
    write_checkpoint_file(old, mine / "last.pt")
    data = shapes(tmp_path / "other", 12)
    fitting.fit(run_config(data, mine, "train.epochs=2"), resume=True)
    assert read_checkpoint(mine / "last.pt")["train_state"]["data"]["train_images"] == 12


def other_val_captions(data: Path, to: Path) -> Path:
    """A copy of the world `data` whose first val image has other captions: the same training data."""
    other = copied(data, to)
    captions = json.loads((other / "captions_val.json").read_text())
    first = captions["images"][0]["id"]
    for annotation in captions["annotations"]:
        if annotation["image_id"] == first:
            annotation["caption"] = "a grey square"
    (other / "captions_val.json").write_text(json.dumps(captions))
    return other


@pytest.mark.parametrize("other", ["more val images scored", "other val captions"])
def test_resume_refuses_other_validation_data_before_any_step(trained: tuple[Path, Path], tmp_path: Path,
                                                              other: str) -> None:
    """best.pt and early stopping follow the val images the run scores: resumed on others, on the same training
    data, the run is not the one that never stopped. The line says the val split differs; last.pt is kept."""
    data, run = trained
    mine = copied(run, tmp_path / "run")
    before = files(mine)
    if other == "more val images scored":
        config = run_config(data, mine, "train.epochs=2", "train.val_max_images=3")
        differs = r"was validated on 2 val images, data\.root=.* with train\.val_max_images=3 gives 3"
    else:
        config = run_config(other_val_captions(data, tmp_path / "other"), mine, "train.epochs=2")
        differs = (r"was validated on other val images than data\.root=.*other with train\.val_max_images=2 gives "
                   r"\(the same 2, other ids or captions, or in another order\)")
    with pytest.raises(CheckpointError, match=(rf"^--resume: {mine / 'last.pt'} {differs}: resume with the same "
                                               r"data, or start a new run$")):
        fitting.fit(config, resume=True)
    assert files(mine) == before


def test_a_checkpoint_that_recorded_the_training_data_alone_resumes_on_other_val_data(
        trained: tuple[Path, Path], tmp_path: Path) -> None:
    """A last.pt that recorded the training data but not the val images (an older one) resumes on other val
    images as before, and the resumed run's last.pt records them."""
    data, run = trained
    mine = copied(run, tmp_path / "run")
    old = read_checkpoint(mine / "last.pt")
    recorded = old["train_state"]["data"]
    assert recorded["val_images"] == 2
    old["train_state"]["data"] = {"train_images": recorded["train_images"], "digest": recorded["digest"]}
    (mine / "last.pt").unlink()  # a hard link to best.pt, maybe: written anew alone
    write_checkpoint_file(old, mine / "last.pt")
    fitting.fit(run_config(other_val_captions(data, tmp_path / "other"), mine, "train.epochs=2"), resume=True)
    now = read_checkpoint(mine / "last.pt")["train_state"]["data"]
    assert now["digest"] == recorded["digest"] and now["val_images"] == 2
    assert now["val_digest"] != recorded["val_digest"]


def test_streamed_shards_are_known_by_their_counts_wherever_they_lie() -> None:
    """The shards' index gives each one's sample count without reading a shard: the same counts at other URLs are
    the same data; other counts are not."""
    from captioner.training.state import data_difference, training_data

    here = training_data([], ShardSet("a/{0..1}.tar", ("a/0.tar", "a/1.tar"), (3, 4)))
    assert training_data([], ShardSet("b/{0..1}.tar", ("b/0.tar", "b/1.tar"), (3, 4))) == here
    other = training_data([], ShardSet("b/{0..1}.tar", ("b/0.tar", "b/1.tar"), (4, 3)))
    assert other != here and here["train_samples"] == 7
    config = tiny_config("data.dataset=webdataset", "data.train_shards=b/{0..1}.tar", "data.val_shards=v.tar")
    assert data_difference(config, here, other) == ("was trained on other data than data.train_shards=b/{0..1}.tar "
                                                    "holds (the same 7 training samples, other counts per shard)")


@pytest.mark.parametrize(("name", "kind", "said"), [
    ("step_losses.csv", "folder", "a folder"),  # written at the first checkpoint, an epoch in
    ("training_curves.png", "folder", "a folder"),  # drawn when the training returns
    ("vocab.json", "pipe", r"not a regular file \(a pipe, a device or a socket\)"),  # its write waited forever
    ("config.yaml", "pipe", r"not a regular file \(a pipe, a device or a socket\)"),
    ("metrics.csv", "loop", r"a link that cannot be followed \(Too many levels of symbolic links\)"),
])
def test_what_stands_where_the_run_writes_a_file_is_refused_before_any_work(name: str, kind: str, said: str,
                                                                            tmp_path: Path) -> None:
    """A folder, a pipe or a loop of links where a run writes one of its files: one line before any work, not a
    failure an epoch in (or at its end), nor a write that waits forever for a pipe's reader; left as it is."""
    from captioner.training.run_folders import check_run_folders

    run = tmp_path / "run"
    run.mkdir()
    {"folder": (run / name).mkdir, "pipe": lambda: os.mkfifo(run / name),
     "loop": lambda: (run / name).symlink_to(name)}[kind]()
    with pytest.raises(StorageError, match=rf"^train\.out_dir={re.escape(str(run))}: {re.escape(name)} is {said}, "
                                           rf"where the run writes its {re.escape(name)}; move it, or set another "
                                           r"train\.out_dir$"):
        check_run_folders(run_config(tmp_path / "shapes", run))
    assert os.path.lexists(run / name)
