"""torchrun with two CPU processes (gloo): the same training as one process with the global
batch, files from rank 0 only, a checkpoint that captions, and a failing rank that stops all."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY_MODEL, subprocess_env
import warm_start

from captioner.apps.cli import main
from captioner.core.config import load_config
from captioner.core.errors import ConfigError
from captioner.data.shapes import generate_shapes
from captioner.models.checkpoint import load_captioner
from captioner.training import distributed

ROOT = Path(__file__).resolve().parents[1]
SHAPES_LSTM = str(ROOT / "configs/shapes_lstm.yaml")  # wherever pytest started

# The COCO set-up in small: a frozen pretrained encoder whose features are computed once, and
# no dropout. Then the two ranks' batches of 4 compute exactly the single process's batch of 8
# and only the order of float sums differs. (An encoder that trains, like the default shapes
# small_cnn, has BatchNorm layers that normalise each rank's batch on its own statistics.)
TINY = [
    *TINY_MODEL,
    "data.image_size=64",
    "data.captions_per_image=one",
    "model.encoder.name=efficientnet_lite0",
    "model.encoder.pretrained=true",
    "model.encoder.fine_tune_blocks=0",
    "model.decoder.dropout=0.0",
    "train.epochs=4",
    "train.lr=3e-3",
    "train.warmup_steps=3",
    "train.log_every=1",
    "train.val_max_images=6",
    "train.early_stopping_patience=0",
    "train.device=cpu",
    "train.cpu_amp=false",  # bf16 rounding depends on how the batch is split: fp32 to compare layouts
    "decode.max_length=8",
]
LOSS_TOLERANCE = 1e-4  # relative, on every step's loss (measured: 2e-5 after 24 steps)
# Adam divides each gradient by its own running scale, so float-order noise in gradients that
# are nearly zero becomes steps of up to lr: weights agree to a few lr-sized steps (measured 1.3e-3).
WEIGHT_TOLERANCE = 5e-3
# The attention score's bias shifts every cell's score alike, which the softmax cancels: its true
# gradient is 0, so all it receives is rounding noise, which Adam scales up to lr-sized steps of
# either sign (measured 6e-3 apart after 24 steps). It changes no output; every other weight is compared.
SHIFT_ONLY = "decoder.attention.score.bias"


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    generate_shapes(root, 48, 6, 2, image_size=32, seed=0, progress=False)  # 6 global batches of 8 an epoch
    return root


def environment(site: Path, **extra: str) -> dict[str, str]:
    site.mkdir(exist_ok=True)
    shutil.copy(ROOT / "tests" / "torchrun_site.py", site / "sitecustomize.py")
    return subprocess_env(PYTHONPATH=f"{site}{os.pathsep}{ROOT}", **extra)  # the site file runs in every rank


def torchrun(args: list[str], env: dict[str, str], timeout: float,
             monitor_interval: float | None = None) -> subprocess.CompletedProcess:
    launcher = [] if monitor_interval is None else [f"--monitor-interval={monitor_interval}"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *launcher,
               *warm_start.TORCHRUN_CAPTIONER, *args]
    return warm_start.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_one_process_needs_no_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = distributed.setup(torch.device("cpu"), 1.0)
    assert not ctx.enabled and ctx.is_main and not distributed.launched()
    assert ctx.sum_host([3, 4]) == [3, 4] and ctx.all_gather("x") == ["x"] and ctx.broadcast(5) == 5
    assert ctx.shard(list(range(5))) == [0, 1, 2, 3, 4]
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="WORLD_SIZE='two' is not an integer"):
        distributed.setup(torch.device("cpu"), 1.0)


def test_distributed_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="dist_timeout_minutes"):
        load_config(None, ["train.dist_timeout_minutes=0"])
    with pytest.raises(ConfigError, match="train.compile"):
        load_config(None, ["train.compile=3"])
    assert load_config(None, ["train.channels_last=true"]).train.channels_last


@pytest.mark.slow
def test_two_ranks_train_like_one_process_with_the_global_batch(shapes: Path, tmp_path: Path) -> None:
    audit = tmp_path / "audit"
    audit.mkdir()
    runs = tmp_path / "runs"
    env = environment(tmp_path / "site", CAPTIONER_TEST_AUDIT=str(audit), CAPTIONER_TEST_WATCH=str(tmp_path / "runs"))
    single_run = warm_start.Popen(  # beside the torchrun one, to save time
        [sys.executable, "-m", "captioner", "train", SHAPES_LSTM, *TINY, "data.batch_size=8",
         f"data.root={shapes}", f"train.out_dir={tmp_path / 'single'}", "train.val_every_steps=4"],
        cwd=ROOT, env=subprocess_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    ddp = torchrun(["train", "-v", SHAPES_LSTM, *TINY, "data.batch_size=4", f"data.root={shapes}",
                    # also validates mid-epoch
                    f"train.out_dir={runs / 'ddp'}", "train.val_every_steps=4"], env, timeout=600)
    _, single_err = single_run.communicate(timeout=600)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert "2 processes x batch 4 = global batch 8; 6 steps per epoch" in ddp.stderr
    assert single_run.returncode == 0, single_err[-3000:]

    ddp_state = torch.load(runs / "ddp" / "last.pt", weights_only=True)
    single_state = torch.load(tmp_path / "single" / "last.pt", weights_only=True)
    ddp_losses = torch.tensor(ddp_state["train_state"]["step_losses"])  # (24, 2): step, loss
    single_losses = torch.tensor(single_state["train_state"]["step_losses"])
    assert ddp_losses.shape == (24, 2) and torch.equal(ddp_losses[:, 0], single_losses[:, 0])
    assert ddp_losses[-6:, 1].mean() < 0.8 * ddp_losses[:6, 1].mean(), ddp_losses[:, 1]  # it learns
    torch.testing.assert_close(ddp_losses[:, 1], single_losses[:, 1], rtol=LOSS_TOLERANCE, atol=0)
    for name, tensor in single_state["model"].items():
        if name == SHIFT_ONLY:
            continue
        torch.testing.assert_close(ddp_state["model"][name], tensor, rtol=0, atol=WEIGHT_TOLERANCE, msg=name)
    # validation is sharded over the ranks and gathered: the same captions, the same scores
    ddp_history, single_history = ddp_state["train_state"]["history"], single_state["train_state"]["history"]
    # every 4 steps and at each epoch's end (6 steps)
    assert [r["step"] for r in ddp_history] == [4, 6, 8, 12, 16, 18, 20, 24]
    assert [{k: v for k, v in r.items() if k.startswith("val_")} for r in ddp_history] == [
        {k: v for k, v in r.items() if k.startswith("val_")} for r in single_history
    ]

    # Only rank 0 wrote: the run folder holds one run's files (the frozen encoder's feature
    # store included, which rank 0 built while rank 1 waited), and rank 1 touched nothing in it.
    names = sorted(p.name for p in (runs / "ddp").iterdir())
    assert names == [
        "best.pt", "config.yaml", "features", "finished.json", "last.pt", "metrics.csv", "step_losses.csv",
        "tensorboard", "training_curves.png", "vocab.json",
    ]
    assert sorted(p.name for p in (runs / "ddp" / "features").iterdir()) == ["train.json", "train.npy",
                                                                             "val.json", "val.npy"]
    assert len(list((runs / "ddp" / "tensorboard").iterdir())) == 1
    rank0, rank1 = ((audit / f"rank{r}.txt").read_text() for r in (0, 1))
    assert "last.pt" in rank0 and "metrics.csv" in rank0  # the audit does see writes
    assert rank1 == ""

    model = load_captioner(runs / "ddp" / "best.pt")
    caption = model.caption(sorted((shapes / "test").iterdir())[0], beam_size=2)
    assert caption.words and set(caption.words) <= set(model.vocab.words)


@pytest.mark.slow
def test_a_failing_rank_stops_every_rank_with_its_message(shapes: Path, tmp_path: Path) -> None:
    env = environment(tmp_path / "site", CAPTIONER_TEST_FAIL_RANK="1")
    start = time.time()
    # torchrun polls its workers every 0.1 s by default and then kills the survivors; rank 0 learns
    # of the failure at its next collective, and when that comes later than the poll it is killed
    # before it can say so (the race made this test flaky). Polling every 5 s leaves it the time.
    result = torchrun(["train", SHAPES_LSTM, *TINY, "data.batch_size=4", f"data.root={shapes}",
                       f"train.out_dir={tmp_path / 'run'}", "train.dist_timeout_minutes=2"], env, timeout=240,
                       monitor_interval=5)
    seconds = time.time() - start
    assert result.returncode != 0
    assert "error: rank 1: injected failure: a file only rank 1 reads is unreadable" in result.stderr
    assert "error: rank 0: stopped because another rank failed" in result.stderr
    assert seconds < 120, f"the ranks took {seconds:.0f}s to stop"  # not the 2-minute collective timeout
    assert not (tmp_path / "run" / "last.pt").exists()


def test_average_gradients_over_two_ranks(tmp_path: Path) -> None:
    """The hand-made average of SCST steps (no DDP wrapper): every rank ends with the mean, a
    missing gradient counts as zero, frozen parameters are left alone. Each rank is a process of
    its own (tests/gloo_rank.py, forked warm)."""
    import json
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = str(Path(__file__).with_name("gloo_rank.py"))
    ranks = [warm_start.Popen([sys.executable, script, str(rank), "2", str(port), str(tmp_path / f"rank{rank}.json")],
                              cwd=ROOT, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
             for rank in (0, 1)]
    try:
        for rank, process in enumerate(ranks):
            _, err = process.communicate(timeout=120)
            assert process.returncode == 0, (rank, err[-2000:])
    finally:
        for process in ranks:
            if process.poll() is None:  # its peer failed and it waits in the collective
                process.kill()
                process.wait()
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result == {"a": [1.5, 1.5, 1.5], "b": [[2.0, 2.0], [2.0, 2.0]], "frozen": None}


@pytest.mark.slow
def test_scst_under_torchrun(shapes: Path, tmp_path: Path) -> None:
    """The second stage runs under torchrun too: two ranks sample their shares from the same
    first-stage checkpoint, rank 0 alone writes, and the result loads and captions."""
    env = environment(tmp_path / "site")
    xe = tmp_path / "xe"
    common = [*TINY, "data.batch_size=4", f"data.root={shapes}", "train.epochs=1"]
    assert main(["train", SHAPES_LSTM, *common, f"train.out_dir={xe}"]) == 0
    scst = tmp_path / "scst"
    result = torchrun(["train", SHAPES_LSTM, *common, f"train.out_dir={scst}", "train.stage=scst",
                       "scst.samples=2", "scst.max_length=6", "train.lr=1e-4", "--init", str(xe / "best.pt")], env,
                       timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = (scst / "metrics.csv").read_text().splitlines()
    assert len(rows) == 3 and "train_reward" in rows[0]  # the header, epoch 0 (the starting model), epoch 1
    # 48 train images, one item per image, 2 ranks x 4: 6 steps
    assert rows[1].startswith("0,0,") and int(rows[2].split(",")[1]) == 6
    model = load_captioner(scst / "best.pt")
    assert model.caption(sorted((shapes / "test").glob("*.jpg"))[:1])[0].words
