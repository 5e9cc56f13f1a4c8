"""Fault: SIGTERM or SIGINT mid-training (what a scheduler sends before it kills a job; Ctrl-C).
The signal is really sent to the training process (under torchrun: to one rank only). The run
finishes its step, writes last.pt, exits 128 + the signal with one line giving the resume
command, and that command ends with the very weights of a run that was never interrupted."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import require, subprocess_env
import warm_start
from test_distributed import TINY as DISTRIBUTED_TINY
from test_distributed import environment as torchrun_environment
from test_resume import TINY, logged_steps

from captioner.data.shapes import generate_shapes

ROOT = Path(__file__).resolve().parents[1]
# No periodic checkpoints: every step since the last validation is lost unless the signal saves it.
SINGLE = [*TINY, "train.checkpoint_every_steps=0"]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    generate_shapes(root, 48, 4, 2, image_size=32, seed=0, progress=False)
    return root


class Training:
    """A training subprocess whose stderr is read as it comes."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.process = warm_start.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True,
                                        start_new_session=True)  # its own process group, as a scheduler's job has
        self.err: list[str] = []
        self.reader = threading.Thread(target=lambda: self.err.extend(self.process.stderr), daemon=True)
        self.reader.start()

    def wait_for_step(self, step: int, timeout: float = 300) -> None:
        deadline = time.time() + timeout
        while max(logged_steps("".join(self.err)), default=0) < step:
            assert self.process.poll() is None, "".join(self.err)[-3000:]
            assert time.time() < deadline, "training too slow to reach the step"
            time.sleep(0.01)

    def finish(self, timeout: float = 600) -> tuple[int, str]:
        code = self.process.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return code, "".join(self.err)


def command(data: Path, out: Path, overrides: list[str], *extra: str) -> list[str]:
    return [sys.executable, "-m", "captioner", "-v", "train", "configs/shapes_lstm.yaml", *overrides,
            f"data.root={data}", f"train.out_dir={out}", *extra]


def resume_line(err: str, signum: int) -> tuple[int, str]:
    """The one line the stopped run prints: the step it stopped after, the resume command."""
    lines = [line for line in err.splitlines() if "resume with:" in line]
    assert len(lines) == 1, err[-3000:]
    name = signal.Signals(signum).name
    found = re.fullmatch(rf"stopped by {name} at step (\d+): (.+?) saved; resume with: (.+)", lines[0])
    assert found, lines[0]
    # No traceback through this package; torchrun reports a worker's non-zero exit (or its own
    # signal) with a traceback of its own.
    assert f'File "{ROOT / "captioner"}' not in err and ("Traceback" not in err
                                                         or "torch.distributed.elastic" in err), err[-3000:]
    return int(found[1]), found[3]


def assert_same_weights(expected_path: Path, got_path: Path) -> None:
    expected, got = torch.load(expected_path, weights_only=True), torch.load(got_path, weights_only=True)
    assert expected["train_state"]["step"] == got["train_state"]["step"]
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, got["model"][name]), name
    for key, state in expected["optimizer"]["state"].items():
        for name, tensor in state.items():
            assert torch.equal(tensor, got["optimizer"]["state"][key][name]), (key, name)


@pytest.fixture(scope="module")
def references() -> dict[int, tuple[Training, Path]]:
    """The uninterrupted runs by count of loader workers, and their folders: the first test that needs one starts
    it (it trains beside that test's signalled run); each test that shares it compares with its last.pt."""
    return {}


@pytest.mark.slow
@pytest.mark.xdist_group("single_signals")  # the runs with no loader workers share their reference
@pytest.mark.parametrize(("signum", "workers", "group"),
                         [(signal.SIGTERM, 0, False), (signal.SIGINT, 0, False), (signal.SIGTERM, 2, True)],
                         ids=["SIGTERM", "SIGINT", "SIGTERM-to-the-group-with-2-loader-workers"])
def test_a_signal_mid_epoch_saves_the_step_and_resumes_bit_exact(shapes: Path, tmp_path: Path, signum: int,
                                                                 workers: int, group: bool,
                                                                 references: dict[int, tuple[Training, Path]]) -> None:
    """`group`: the signal goes to every process of the job (the trainer and its DataLoader
    workers), as a scheduler sends it."""
    env = subprocess_env()
    overrides = [*SINGLE, f"data.num_workers={workers}"]
    if workers not in references:
        references[workers] = Training(command(shapes, tmp_path / "reference", overrides), env), tmp_path / "reference"
    reference, reference_run = references[workers]
    run = tmp_path / "signalled"
    stopped = Training(command(shapes, run, overrides), env)
    stopped.wait_for_step(5)  # mid-epoch 1 (12 steps an epoch), no checkpoint written yet
    if group:
        os.killpg(stopped.process.pid, signum)
    else:
        os.kill(stopped.process.pid, signum)
    code, err = stopped.finish()
    assert code == 128 + signum, err[-3000:]
    step, resume = resume_line(err, signum)
    saved = torch.load(run / "last.pt", weights_only=True)["train_state"]
    assert saved["step"] == step == max(logged_steps(err)) and 5 <= step < 12, (step, saved["step"])  # no step lost
    assert saved["position"] == step  # mid-epoch: the position in the epoch goes into last.pt

    words = shlex.split(resume)
    assert words[:2] == ["captioner", "train"] and words[-1] == "--resume"
    resumed = warm_start.run([sys.executable, "-m", "captioner", "-v", *words[1:]], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert logged_steps(resumed.stderr) == list(range(step + 1, 25))
    code, reference_err = reference.finish()  # at once for a run an earlier test finished
    assert code == 0, reference_err[-3000:]
    assert_same_weights(reference_run / "last.pt", run / "last.pt")


def worker_pids(launcher: int) -> dict[int, int]:
    """rank -> pid of the processes torchrun started."""
    ranks: dict[int, int] = {}
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    for pid in map(int, children):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        rank = next((int(v.split(b"=")[1]) for v in environ if v.startswith(b"RANK=")), None)
        if rank is not None:
            ranks[rank] = pid
    return ranks


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            *warm_start.TORCHRUN_CAPTIONER]
TORCHRUN_OVERRIDES = [*DISTRIBUTED_TINY, "data.batch_size=4", "train.epochs=2"]


@pytest.fixture(scope="module")
def torchrun_reference(shapes: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The two-rank run that is never interrupted (its last.pt), trained once for both targets."""
    root = tmp_path_factory.mktemp("torchrun_reference")
    env = torchrun_environment(root / "site")
    reference = Training([*TORCHRUN, *command(shapes, root / "reference", TORCHRUN_OVERRIDES)[3:]], env)
    code, reference_err = reference.finish()
    assert code == 0, reference_err[-3000:]
    return root / "reference" / "last.pt", env


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun_signals")  # both targets on the worker that trained the reference
@pytest.mark.parametrize("target", ["rank 1", "torchrun"])
def test_sigterm_to_one_rank_stops_every_rank_after_the_same_step(
    shapes: Path, tmp_path: Path, target: str, torchrun_reference: tuple[Path, dict[str, str]],
) -> None:
    """`rank 1`: one rank alone receives it; `torchrun`: the launcher, which forwards it to every rank."""
    require(Path("/proc/self/task").is_dir(), "finds the ranks' processes in /proc (Linux)")
    reference_last, env = torchrun_reference
    overrides, launch = TORCHRUN_OVERRIDES, TORCHRUN
    run = tmp_path / "signalled"
    stopped = Training([*launch, *command(shapes, run, overrides)[3:]], env)
    stopped.wait_for_step(3)  # 6 steps an epoch
    ranks = worker_pids(stopped.process.pid)
    assert sorted(ranks) == [0, 1]
    # rank 1 alone: rank 0 learns of it through the step's all-reduce
    os.kill(ranks[1] if target == "rank 1" else stopped.process.pid, signal.SIGTERM)
    code, err = stopped.finish(timeout=300)
    step, resume = resume_line(err, signal.SIGTERM)
    assert code != 0  # (one line from rank 0 alone: resume_line)
    saved = torch.load(run / "last.pt", weights_only=True)["train_state"]
    assert saved["step"] == step and len(saved["rng"]) == 2  # both ranks' random states, gathered at the same step
    words = shlex.split(resume)
    assert words[:3] == ["torchrun", "--nproc_per_node=2", "-m"] and words[-1] == "--resume"
    resumed = warm_start.run([*launch, "-v", *words[4:]], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_weights(reference_last, run / "last.pt")


def test_repeated_signals_never_kill_but_a_later_ctrl_c_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real signals to this process: SIGTERM twice (a scheduler and torchrun each forward one)
    only asks once; the same Ctrl-C delivered twice at once is one; Ctrl-C again later stops now."""
    import captioner.training.loop as loop
    from captioner.training.distributed import Distributed

    monkeypatch.setattr(loop, "REPEAT_GRACE_SECONDS", 0.2)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stop = loop.StopSignals()
    stop.install()
    try:
        alone = Distributed(torch.device("cpu"))
        assert not stop.stop_after_step([0, 0], alone)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.votes() == [1, 0] and stop.stop_after_step([0, 0], alone) and stop.signal == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # at once: the same Ctrl-C
        assert stop.votes() == [1, 1]
        time.sleep(0.3)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # the handler runs at the next bytecode
    finally:
        stop.restore()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # the handlers are given back


def test_under_torchrun_the_summed_votes_decide_not_this_ranks_own() -> None:
    from captioner.training.distributed import Distributed
    from captioner.training.loop import StopSignals

    rank = Distributed(torch.device("cpu"), rank=0, world_size=2)
    stop = StopSignals()
    assert not stop.stop_after_step([0, 0], rank)
    assert stop.stop_after_step([0, 1], rank) and stop.signal == signal.SIGINT  # another rank's Ctrl-C


INTERRUPTED_IMPORT = """
import importlib.abc, os, signal, sys, time
import captioner.apps.cli as cli

done = []

class SlowImport(importlib.abc.MetaPathFinder):  # Ctrl-C inside the first import of torch, pressed at once
    def find_spec(self, name, path, target=None):
        if name == "captioner.training.distributed" and not done:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            done.append(True)
        return None  # the usual finders import it

sys.meta_path.insert(0, SlowImport())
status = cli.main(["config", "show"])
print("import whole" if "captioner.training.distributed" in sys.modules else "import cut")
sys.exit(status)
"""


def test_ctrl_c_during_the_first_import_is_one_line_after_it_not_a_traceback_inside_it(tmp_path: Path) -> None:
    """Ctrl-C in the first second raised inside torch's import: a traceback, or, caught by a library's bare
    `except:`, a half-imported numpy and a command that ran on. Held back, it ends the command after the import."""
    env = {**subprocess_env(), "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (done.returncode, done.stderr.strip()) == (130, "interrupted"), done.stderr[-2000:]
    assert done.stdout.strip() == "import whole"
