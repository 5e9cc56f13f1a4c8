"""Every script in scripts/, benchmarks/ and demo/ starts, parses its arguments and explains
itself: `--help` exits 0 with a usage line, so a script broken by a moved or renamed module
fails here instead of in a user's hands."""

from __future__ import annotations

import json
import os
import shutil
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_held_elsewhere, shared_folder
import warm_start

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p.relative_to(ROOT) for folder in ("scripts", "benchmarks", "demo")
               for p in (ROOT / folder).glob("*.py"))
SCRIPTS = [p for p in FILES if '__name__ == "__main__"' in (ROOT / p).read_text()]
SUPPORT = [p for p in FILES if p not in SCRIPTS]  # modules the scripts share (the reference's loader)


def test_the_scripts_are_found() -> None:
    assert {"benchmarks/bench_gpu.py", "scripts/plot_runs.py", "demo/app.py"} <= {str(p) for p in SCRIPTS}


@pytest.mark.parametrize("module", SUPPORT, ids=str)
def test_every_support_module_is_used_by_a_script(module: Path) -> None:
    users = [p for p in SCRIPTS if p.parent == module.parent and f"{module.stem}" in (ROOT / p).read_text()]
    assert users, f"{module}: no script imports it (dead code, or a script without a __main__ guard)"


@pytest.fixture(scope="module")
def helps(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every script's `--help`, run in one fresh interpreter (tests/help_runner.py) rather than
    one each: the same checks, without importing torch 30 times.

    Under `--dist loadgroup` (scripts/run_tests.sh) the xdist_group below keeps every test_help on
    one worker, so this runs on one worker only (again there only when a shuffled order leaves the
    module and comes back). A run on a second worker means the groups were ignored, as pytest 9.2
    with pytest-xdist 3.8 silently does (pytest-dev/pytest-xdist#1386): then every group's shared
    fixture is built on each worker and the other waits on its lock, so it fails."""
    if getattr(request.config.option, "loadgroup", False):
        ran = shared_folder(tmp_path_factory) / "script_helps.ran"
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        try:  # the same worker again is a shuffled order that left the module and came back: not the bug
            with open(ran, "x") as f:
                f.write(worker)
        except FileExistsError:
            if ran.read_text() != worker:
                pytest.fail("the script_helps group ran on two pytest workers: --dist loadgroup ignored xdist_group "
                            "(pytest 9.2 with pytest-xdist 3.8, pytest-dev/pytest-xdist#1386; "
                            "pyproject.toml pins pytest below 9.2)")
    folder = tmp_path_factory.mktemp("helps")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "help_runner.py"), str(folder / "helps.json"), str(folder / "work"),
         *(str(ROOT / p) for p in SCRIPTS)],
        cwd=folder, capture_output=True, text=True, env=env, timeout=600,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return json.loads((folder / "helps.json").read_text(encoding="utf-8"))


@pytest.mark.xdist_group("script_helps")  # one worker runs the runner once for all of them
@pytest.mark.parametrize("script", SCRIPTS, ids=str)
def test_help(script: Path, helps: dict[str, dict]) -> None:
    result = helps[str(ROOT / script)]
    assert result["code"] == 0, (result["stdout"] + result["stderr"])[-2000:]
    assert "usage:" in result["stdout"].lower(), result["stdout"][-1000:]
    assert result["files"] == []  # --help writes nothing


def test_the_help_runner_reports_a_script_that_fails_to_import(tmp_path: Path) -> None:
    """A script broken by a moved module must fail its test, not pass on another script's imports."""
    broken = tmp_path / "broken.py"
    broken.write_text('import argparse\nfrom captioner.no_such_module import x\nif __name__ == "__main__":\n'
                      '    argparse.ArgumentParser().parse_args()\n', encoding="utf-8")
    writer = tmp_path / "writer.py"
    writer.write_text('import argparse\nif __name__ == "__main__":\n    open("left.txt", "w").close()\n'
                      '    argparse.ArgumentParser().parse_args()\n', encoding="utf-8")
    subprocess.run([sys.executable, str(ROOT / "tests" / "help_runner.py"), str(tmp_path / "out.json"),
                    str(tmp_path / "work"),
                    str(broken), str(writer)], check=True, cwd=tmp_path, timeout=300)
    results = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert (results[str(broken)]["code"] == "raised"
            and "No module named 'captioner.no_such_module'" in results[str(broken)]["stderr"])
    assert results[str(writer)]["code"] == 0 and results[str(writer)]["files"] == ["left.txt"]


QUICKSTART = Path(__file__).resolve().parent.parent / "scripts" / "quickstart.sh"
WARM_RANK = Path(__file__).resolve().parent / "warm_rank.py"


def run_quickstart(tmp_path: Path, *args: str, java: bool) -> tuple[subprocess.CompletedProcess, list[str]]:
    """scripts/quickstart.sh with the set-up skipped and a `captioner` that only records its
    arguments; `java` on the PATH or not."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls.txt"
    (bin_dir / "captioner").write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(calls))}\n')
    (bin_dir / "captioner").chmod(0o755)
    for tool in ("sed", "dirname", "mv"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    # this interpreter, captioner importable; the script's `python - ARGS <<PY` (its config read: torch imported)
    # forked from the warm interpreter (tests/warm_rank.py), which needs its variables
    python = shlex.quote(sys.executable)
    warm = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in warm_start.rank_environment().items())
    (bin_dir / "python").write_text(
        f'#!/bin/sh\nif [ "$1" = - ]; then\n{warm}exec {python} -S -u {shlex.quote(str(WARM_RANK))} "$@"\nfi\n'
        f'exec {python} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    if java:
        (bin_dir / "java").symlink_to("/bin/true")
    setup = tmp_path / "setup.sh"
    setup.write_text("")
    env = {"PATH": str(bin_dir), "SETUP": str(setup), "HOME": str(tmp_path)}
    result = subprocess.run(["/bin/bash", str(QUICKSTART), *args], capture_output=True, text=True, env=env)
    return result, calls.read_text().splitlines() if calls.exists() else []


def test_quickstart_evaluates_the_run_its_overrides_train(tmp_path: Path) -> None:
    result, calls = run_quickstart(tmp_path, "train.out_dir=runs/mine", "data.root=data/world", "--resume", java=True)
    assert result.returncode == 0, result.stderr
    assert calls[0] == "train configs/shapes_lstm.yaml train.out_dir=runs/mine data.root=data/world --resume"
    assert calls[1] == "evaluate runs/mine/best.pt --split test --beam 3"
    assert calls[2].startswith("caption runs/mine/best.pt data/world/test/test_000000.jpg")


def test_quickstart_without_java_says_so_first_and_scores_in_process(tmp_path: Path) -> None:
    run = tmp_path / "run"  # not the checkout's runs/shapes_lstm, whose run the script would move aside
    result, calls = run_quickstart(tmp_path, f"train.out_dir={run}", java=False)
    assert result.returncode == 0, result.stderr
    assert "Java not found" in result.stdout and "openjdk-17" in result.stdout
    assert calls[1] == f"evaluate {run}/best.pt --split test --beam 3 --fast"


def test_quickstart_run_again_moves_its_earlier_run_aside_to_the_first_free_name(tmp_path: Path) -> None:
    """`captioner train` refuses to start a new run over an earlier one: run a second time (train.epochs=3 after
    a full run), the script moves the earlier run aside whole, and trains and scores the new one."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.pt").write_bytes(b"the earlier run's")
    (tmp_path / "run.previous-1").mkdir()  # an earlier move's
    result, calls = run_quickstart(tmp_path, f"train.out_dir={run}/", "train.epochs=3", java=True)
    assert result.returncode == 0, result.stderr
    assert f"note: the earlier run in {run} is kept as {run}.previous-2 (--resume continues" in result.stdout
    assert not run.exists() and (tmp_path / "run.previous-2" / "best.pt").read_bytes() == b"the earlier run's"
    assert calls[:2] == [f"train configs/shapes_lstm.yaml train.out_dir={run}/ train.epochs=3",
                         f"evaluate {run}/best.pt --split test --beam 3"]


@pytest.mark.parametrize("resume", [True, False], ids=["a run resumed", "a folder without a checkpoint"])
def test_quickstart_leaves_a_run_it_resumes_or_a_folder_that_holds_none_where_it_is(tmp_path: Path,
                                                                                     resume: bool) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / ("last.pt" if resume else "notes.txt")).write_bytes(b"mine")
    result, calls = run_quickstart(tmp_path, f"train.out_dir={run}", *(["--resume"] if resume else []), java=True)
    assert result.returncode == 0, result.stderr
    assert "earlier run" not in result.stdout and [p.name for p in tmp_path.glob("run*")] == ["run"]
    assert calls[0].startswith(f"train configs/shapes_lstm.yaml train.out_dir={run}")


@pytest.mark.parametrize("given", ["train.init={run}/best.pt", "--init={run}/../run/best.pt"],
                         ids=["train.init", "--init, another spelling"])
def test_quickstart_run_again_starts_from_the_earlier_runs_checkpoint_where_it_moved(tmp_path: Path,
                                                                                     given: str) -> None:
    """Fine-tune the earlier run into a new one (`bash scripts/quickstart.sh train.init=runs/shapes_lstm/best.pt`):
    the earlier run is moved aside whole, its best.pt with it, so the new run starts from it there, said in a note."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.pt").write_bytes(b"the earlier run's")
    result, calls = run_quickstart(tmp_path, f"train.out_dir={run}", *given.format(run=run).split(), java=True)
    assert result.returncode == 0, result.stderr
    moved = f"{run}.previous-1/best.pt"
    assert f"note: train.init is in the earlier run, so the new run starts from {moved}\n" in result.stdout
    assert calls[0].endswith(f" --init {moved}") and Path(moved).read_bytes() == b"the earlier run's"


def test_quickstart_run_again_leaves_a_start_checkpoint_outside_the_earlier_run_as_given(tmp_path: Path) -> None:
    run, start = tmp_path / "run", tmp_path / "run_two" / "best.pt"  # beside the run folder, its name a prefix
    run.mkdir()
    (run / "best.pt").write_bytes(b"the earlier run's")
    result, calls = run_quickstart(tmp_path, f"train.out_dir={run}", "--init", str(start), java=True)
    assert result.returncode == 0, result.stderr
    assert "train.init is in" not in result.stdout
    assert calls[0] == f"train configs/shapes_lstm.yaml train.out_dir={run} --init {start}"


def test_quickstart_run_again_while_its_run_trains_leaves_that_run_where_it_is(tmp_path: Path) -> None:
    """Before, the quickstart started again while its first run trained (in a second terminal, say) moved that
    run's folder aside from under it, and the first run's next checkpoint had no folder to go to. Now it stops in
    the line `captioner train` says, before anything is moved or trained."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "last.pt").write_bytes(b"the running run's")
    env = {**{k: v for k, v in os.environ.items() if k not in ("CAPTIONER_CACHE_DIR", "XDG_CACHE_HOME")},
           "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}  # HOME: the cache of the quickstart below
    with run_held_elsewhere(run, env) as holder:
        result, calls = run_quickstart(tmp_path, f"train.out_dir={run}", java=True)
    assert result.returncode == 2 and calls == []
    assert result.stderr == (f"error: train.out_dir={run}: another training run (process {holder.pid}) is writing "
                             "into this folder; wait for it to end, or give another train.out_dir\n")
    assert [p.name for p in tmp_path.glob("run*")] == ["run"] and (run / "last.pt").read_bytes() == b"the running run's"


def test_quickstart_stops_on_a_bad_override_before_training(tmp_path: Path) -> None:
    result, calls = run_quickstart(tmp_path, "train.epochs=lots", java=True)
    assert result.returncode != 0 and calls == []
    assert result.stderr.strip().count("\n") == 0 and "train.epochs" in result.stderr


FLICKR8K_FULL = Path(__file__).resolve().parent.parent / "scripts" / "flickr8k_full.sh"


# Runs argv[1:] with SIGINT at its default. A shell started with SIGINT ignored (as pytest-xdist's
# workers have it, or as `&` leaves a script) can neither trap it nor be ended by it; a disposition
# set before exec stays. (Popen's preexec_fn would do it in the forked child, unsafely beside threads.)
DEFAULT_INTERRUPT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])")


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_flickr8k_full_records_the_step_a_signal_ends(tmp_path: Path, signal_number: int) -> None:
    """Ctrl-C or `kill -- -PGID` in the middle of a step still leaves its row in timings.tsv (the
    signal's status), so the totals of a stopped and resumed build keep the stopped part."""
    repo, bin_dir, out, started = tmp_path / "repo", tmp_path / "bin", tmp_path / "out", tmp_path / "started"
    (repo / "scripts").mkdir(parents=True)
    for script in (FLICKR8K_FULL, ROOT / "scripts" / "sweep_runs.sh", ROOT / "scripts" / "run_state.py"):
        shutil.copy(script, repo / "scripts")
    bin_dir.mkdir()
    # this interpreter, with this checkout's captioner (scripts/run_state.py reads the run folder with it)
    python = f'PYTHONPATH={shlex.quote(str(ROOT))} exec {shlex.quote(sys.executable)} "$@"'
    (bin_dir / "python").write_text(f"#!/bin/sh\n{python}\n")
    (bin_dir / "python").chmod(0o755)
    # a training run that takes its time
    (bin_dir / "captioner").write_text(f"#!/bin/sh\ntouch {shlex.quote(str(started))}\nexec sleep 60\n")
    (bin_dir / "captioner").chmod(0o755)
    (repo / ".venv" / "bin").mkdir(parents=True)
    (repo / ".venv" / "bin" / "activate").write_text(f'PATH="{bin_dir}:$PATH"\n')
    (repo / "data").mkdir()
    (repo / "data" / "Flickr8k.token.txt").write_text("")
    command = [sys.executable, "-c", DEFAULT_INTERRUPT, "bash", str(repo / "scripts" / "flickr8k_full.sh"), "data",
               "images", "lstm"]
    build = subprocess.Popen(command, env={**os.environ, "OUT": str(out)}, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while not started.exists():
        assert build.poll() is None and time.monotonic() < deadline, build.communicate()[0]
        time.sleep(0.05)
    time.sleep(1.2)  # a step of at least a second
    os.killpg(build.pid, signal_number)
    output = build.communicate(timeout=30)[0]
    assert build.returncode == -signal_number, output  # the script ends by the signal, as an unhandled one would end it
    rows = [line.split("\t") for line in (out / "timings.tsv").read_text().splitlines()]
    assert len(rows) == 1 and rows[0][0] == "train lstm" and rows[0][4] == str(128 + signal_number), rows
    assert int(rows[0][1]) >= 1 and rows[0][3], rows  # its seconds and the processor's name
    assert not (out / "lstm" / "train.done").exists()  # stopped, so it resumes on the next run


def test_flickr8k_full_defaults_to_the_users_data_folder_and_names_the_command_that_fetches_it(tmp_path: Path) -> None:
    """Without arguments the script reads data/flickr8k (where `captioner data flickr8k` unpacks the
    dataset); without its caption file it says so in one line, naming that command, before anything runs."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(FLICKR8K_FULL, repo / "scripts")
    result = subprocess.run(["bash", str(repo / "scripts" / "flickr8k_full.sh")], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == ("flickr8k_full.sh: data/flickr8k/Flickr8k.token.txt not found: fetch Flickr8k "
                                     "with `captioner data flickr8k --root data/flickr8k`, or name its folder as the "
                                     "first argument")


@pytest.mark.parametrize(
    "gpu, choice, index",
    [
        (False, None, "https://download.pytorch.org/whl/cpu"),  # no GPU: the CPU-only wheels, not the CUDA stack
        (True, None, ""),  # a GPU: the default index's CUDA build
        (True, "cpu", "https://download.pytorch.org/whl/cpu"),
        (False, "cuda", ""),
        (False, "https://mirror.example/simple", "https://mirror.example/simple"),
    ],
    ids=["no gpu", "gpu", "cpu chosen", "cuda chosen", "own index"],
)
def test_torch_comes_from_the_index_that_fits_the_machine(tmp_path: Path, gpu: bool, choice: str | None,
                                                          index: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if gpu:  # a stand-in nvidia-smi that lists one GPU
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100'\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **({"TORCH_INDEX": choice} if choice else {})}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "torch_index.sh")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == index, done.stderr


def index_answers(url: str) -> tuple[int, float]:
    """scripts/index_answers.sh's exit status for `url` (2 s to answer), and how long it took."""
    started = time.monotonic()
    done = subprocess.run(["bash", str(ROOT / "scripts" / "index_answers.sh"), url, "2"], capture_output=True,
                          text=True, timeout=60)
    assert not done.stderr, done.stderr
    return done.returncode, time.monotonic() - started


def test_setup_asks_whether_an_index_answers_before_installing_from_it(tmp_path: Path) -> None:
    """Any HTTP answer counts (the installer decides what it serves); a server that is not there
    is reported at once, not after the installers' retries; a file:// index is never asked."""
    server = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory",
                               str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(server.stdout.readline().split("port ")[1].split()[0])  # "Serving HTTP on 127.0.0.1 port N ..."
        assert index_answers(f"http://127.0.0.1:{port}/")[0] == 0
        assert index_answers(f"http://127.0.0.1:{port}/whl/cpu/")[0] == 0  # a 404 is an answer
        server.terminate()
        server.wait(timeout=10)
        status, seconds = index_answers(f"http://127.0.0.1:{port}/")  # nothing listens there now
        assert status == 1 and seconds < 10
    finally:
        server.kill()
    assert index_answers(f"file://{tmp_path}")[0] == 0
    assert "index_answers.sh" in (ROOT / "scripts" / "setup.sh").read_text()  # and setup.sh asks it


def test_a_torch_index_choice_that_means_nothing_is_one_line() -> None:
    done = subprocess.run(["bash", str(ROOT / "scripts" / "torch_index.sh")],
                          env={"PATH": "/usr/bin:/bin", "TORCH_INDEX": "gpu"},
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode == 2 and done.stderr.strip()
            == "scripts/torch_index.sh: TORCH_INDEX=gpu: use auto, cpu, cuda or an index URL")


def test_bench_metrics_names_a_missing_annotation_file_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "captions_val2014.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_metrics.py"), str(missing)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and done.stderr.strip() == f"error: {missing}: annotation file not found"


FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "{log}"
case "$*" in
  "-m venv .venv") mkdir -p .venv/bin && cp "$0" .venv/bin/python &&
                   printf 'PATH="%s/.venv/bin:$PATH"\\n' "$PWD" > .venv/bin/activate ;;
  "-m uv "*) [ -z "$FAIL_UV" ] ;;
esac
"""


@pytest.mark.parametrize("uv_fails", [False, True], ids=["uv installs", "uv fails"])
def test_setup_upgrades_pip_only_before_pip_installs_something(tmp_path: Path, uv_fails: bool) -> None:
    """Upgrading the venv's pip took 3 s of every set-up, the quickstart's and CI's, though uv installs it all:
    now pip is brought up to date once, before the first install that falls back to it. A `python` that writes
    down its arguments stands in for the interpreter and the venv."""
    log = tmp_path / "calls.txt"
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON.format(log=log))
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}{os.pathsep}/usr/bin:/bin", "PYTHON": str(fake), "TORCH_INDEX": "cuda", "EXTRAS": "",
           **({"FAIL_UV": "1"} if uv_fails else {})}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    venv_python = tmp_path / ".venv" / "bin" / "python"
    uv = f"-m uv pip install --quiet --compile-bytecode --python {venv_python}"
    torch = "torch==2.14.1 torchvision==0.29.1"
    if not uv_fails:
        assert calls == ["-m venv .venv", "-m pip install --quiet uv", f"{uv} {torch}", f"{uv} -e .",
                         "-m compileall -q -j 0 captioner"]
    else:
        assert calls == ["-m venv .venv", "-m pip install --quiet uv", f"{uv} {torch}",
                         "-m pip install --quiet --upgrade pip", f"-m pip install --quiet {torch}", f"{uv} -e .",
                         "-m pip install --quiet -e .", "-m compileall -q -j 0 captioner"]
