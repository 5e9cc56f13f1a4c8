"""tests/warm_start.py: a child forked from the warm interpreter behaves as the cold
interpreter would, for the commands, pipes, signals and environments the suite gives it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import warm_start
from helpers import subprocess_env

SHOW = ("import os, sys; print(sys.argv, os.getcwd(), os.environ.get('WARM_TEST'), sys.path[0]); print('to stderr', "
        "file=sys.stderr)")


def both(command: list[str], **kwargs) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    return warm_start.run(command, **kwargs), subprocess.run(command, **kwargs)


@pytest.mark.parametrize("command,expect", [
    ([SHOW + "; sys.exit(3)", "a", "b c"], 3),
    (["import sys; sys.exit('a message')"], 1),
    (["raise ValueError('boom')"], 1),
    (["import sys; print(sys.stdin.read().upper(), end='')"], 0),
    (["import sys; sys.stdout.write('a\\r\\nb\\rc\\n')"], 0),
])
def test_a_forked_child_prints_and_exits_as_a_cold_one(command: list[str], expect: int, tmp_path: Path) -> None:
    kwargs = dict(capture_output=True, text=True, cwd=tmp_path, env=subprocess_env(WARM_TEST="x"), input="some input\n",
                  timeout=120)
    warm, cold = both([sys.executable, "-c", *command], **kwargs)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert warm.returncode == expect


def test_standard_input_is_buffered_as_a_cold_ones() -> None:
    """read(n) of a pipe's raw file may return less than n; the interpreter's sys.stdin.buffer, and pickle.load of
    it (the demo's decoding child), gets all n."""
    command = [sys.executable, "-c", "import sys; print(len(sys.stdin.buffer.read(300_000)))"]
    warm, cold = both(command, capture_output=True, text=True, input="x" * 300_000, env=subprocess_env(), timeout=120)
    assert warm.stdout == cold.stdout == "300000\n"


@pytest.mark.parametrize("start", [warm_start.Popen, subprocess.Popen], ids=["warm", "cold"])
def test_standard_input_takes_every_byte_written_though_a_signal_interrupts(start) -> None:
    """A signal that interrupts a write into a full pipe leaves it written in part, and a raw file says so only in
    the count it returns; subprocess's stdin is buffered and writes the rest. The warm child's was raw: under a
    profiler's signals the demo's pickled requests came apart ("invalid load key")."""
    process = start([sys.executable, "-c", "import sys, time; time.sleep(0.5); print(len(sys.stdin.buffer.read()))"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=subprocess_env())
    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)  # while the child sleeps, the pipe full
    try:
        process.stdin.write(b"x" * 2_000_000)  # the count it returns unread, as pickle's writes leave it
        process.stdin.flush()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    process.stdin.close()
    assert process.stdout.read() == b"2000000\n"
    assert process.wait(timeout=120) == 0


def test_modules_and_scripts_run_as_main(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(__name__, sys.argv[1:], sys.path[0])\n")
    env = subprocess_env()
    for command in ([str(script), "x"], ["-m", "json.tool"]):
        warm, cold = both([sys.executable, *command], capture_output=True, text=True, input='{"a": [1]}', env=env,
                          timeout=120)
        assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert warm.stdout == '{\n    "a": [\n        1\n    ]\n}\n'


def test_the_child_is_forked_warm_and_its_cpu_is_counted() -> None:
    before = warm_start.forked_cpu()
    process = warm_start.Popen([sys.executable, "-c",
                                "import sys, time\nprint('torch' in sys.modules)\nend = time.process_time() + 0.3\n"
                                "while time.process_time() < end: pass"], stdout=subprocess.PIPE, text=True,
                                env=subprocess_env())
    out, _ = process.communicate(timeout=120)
    assert process.warm and out == "True\n"  # torch already loaded: it was forked, not started
    assert process.cpu >= 0.3 and warm_start.forked_cpu() - before >= 0.3


def test_what_the_servers_imports_set_sends_no_command_cold() -> None:
    """torchvision's import sets TORCHINDUCTOR_CACHE_DIR where it is unset, in the server and in a test worker that
    imports it later; inductor reads it at each use. The server's children were cold, or failed, by whether this
    worker had imported torchvision before or after the server started: this file failed when run alone."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = os.path.abspath(default_cache_dir())
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR", default) != default:
        pytest.skip("TORCHINDUCTOR_CACHE_DIR is set to a folder of the user's")
    env = {name: value for name, value in subprocess_env().items() if name != "TORCHINDUCTOR_CACHE_DIR"}
    for form in (env, {**env, "TORCHINDUCTOR_CACHE_DIR": default}):
        process = warm_start.Popen([sys.executable, "-c", "print('forked')"], stdout=subprocess.PIPE, text=True,
                                   env=form)
        assert process.warm and process.communicate(timeout=120)[0] == "forked\n"


def test_a_variable_read_when_libraries_load_sends_the_command_cold() -> None:
    process = warm_start.Popen([sys.executable, "-c", "import sys; print('torch' in sys.modules)"],
                               stdout=subprocess.PIPE,
                               text=True, env=subprocess_env(OMP_NUM_THREADS="3"))
    assert not process.warm and process.communicate(timeout=120)[0] == "False\n"


def test_pythonpath_and_its_sitecustomize_are_the_childs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['SITE_RAN'] = 'yes'\n")
    (tmp_path / "extra_module.py").write_text("NAME = 'found'\n")
    env = subprocess_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    code = "import os, extra_module; print(extra_module.NAME, os.environ.get('SITE_RAN'))"
    warm, cold = both([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert warm.stdout == cold.stdout == "found yes\n", (warm.stderr, cold.stderr)


def signals_as_from_a_shell() -> None:
    """In the cold reference child before its exec: SIGINT and SIGTERM at their defaults and
    nothing blocked, as a shell starts an interpreter. A child inherits its parent's blocked
    signals and ignored ones, and a pytest worker need not be in a shell's state: a cold child
    forked from one could ignore this test's SIGINT until its 60 s sleep ends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def signal_state(pid: int) -> str:
    """A process's blocked, ignored and caught signals, its threads, state, and where the kernel holds it (the wait
    channel and system call), from /proc: what says whether a child that outlived its signal never got it, or got it
    and hangs on the way out (a lock, a full pipe)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as e:
        return str(e)
    shown = [line.replace("\t", " ") for line in lines
             if line.startswith(("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt", "Threads"))]
    for name in ("wchan", "syscall"):
        try:
            shown.append(f"{name}: {Path(f'/proc/{pid}/{name}').read_text().strip()}")
        except OSError:
            pass
    return ", ".join(shown)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_signal_ends_the_child_with_the_status_a_cold_one_has(sig: int) -> None:
    code = "import os, time; print(os.getpid(), os.getsid(0), flush=True); time.sleep(60)"
    codes = []
    for popen, extra in ((warm_start.Popen, {}), (subprocess.Popen, {"preexec_fn": signals_as_from_a_shell})):
        process = popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        env=subprocess_env(), start_new_session=True, **extra)
        pid, session = map(int, process.stdout.readline().split())
        assert pid == process.pid == session  # its own session, as asked
        process.send_signal(sig)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            state = signal_state(pid)
            process.kill()
            process.wait()
            pytest.fail(f"{popen.__module__}.Popen's child outlived signal {sig} by 30 s: {state}; "
                        f"this test process: {signal_state(os.getpid())}, SIGINT handler "
                        f"{signal.getsignal(signal.SIGINT)}")
        codes.append(process.returncode)
        process.stdout.close()
        process.stderr.close()
    assert codes[0] == codes[1] == -sig


def test_a_timeout_kills_the_child() -> None:
    started = time.time()
    with pytest.raises(subprocess.TimeoutExpired):
        warm_start.run([sys.executable, "-c", "import time; time.sleep(60)"], env=subprocess_env(), timeout=1)
    assert time.time() - started < 30


def start_tick(pid: int) -> str:
    """The clock tick a running process began at (/proc's stat field 22): with its pid, it names
    the process even after the number is taken again."""
    return warm_start.proc_stat(pid)[19]


def gone(pid: int, started: str, seconds: float = 30) -> bool:
    """Whether the process `pid` begun at tick `started` ends within `seconds`: its /proc entry
    goes, or holds a later process that took the number again."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if start_tick(pid) != started:
                return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


# Writes "pid start-tick" to the file argv[1] names, then sleeps argv[2] seconds.
WRITE_PID_AND_SLEEP = ("import os, sys, time\n"
                       "started = open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19]\n"
                       "open(sys.argv[1] + '.part', 'w').write(f'{os.getpid()} {started}')\n"
                       "os.replace(sys.argv[1] + '.part', sys.argv[1])\ntime.sleep(float(sys.argv[2]))\n")


def test_a_child_whose_asker_left_before_its_pid_was_sent_is_ended(tmp_path: Path) -> None:
    """The asker (a rank's worker program that torchrun signalled at once, say) may be gone before
    the server answers with the child's pid: the child must not run on unwatched."""
    server = warm_start._the_server()
    ended = Path(server.folder, "cpu")  # a monitor appends a line here once it has reaped its child

    def ask(pid_file: Path, seconds: str) -> socket.socket:
        null = os.open(os.devnull, os.O_RDWR)
        conn = warm_start.ask(server.path, "code", WRITE_PID_AND_SLEEP, [str(pid_file), seconds], unbuffered=True,
                              cwd=str(tmp_path), env=server.env, new_session=False, fds=[null, null, null])
        os.close(null)
        return conn

    with ask(tmp_path / "watched", "0") as conn:  # the same request, its asker staying: it runs and ends
        pid = warm_start._receive(conn)[0]["pid"]
        assert warm_start._receive(conn)[0]["status"] == 0
        assert (tmp_path / "watched").read_text().split()[0] == str(pid)
    lines = ended.read_text().count("\n") if ended.exists() else 0
    ask(tmp_path / "left", "60").close()  # gone before the reply: the pid meets a closed connection
    deadline = time.time() + 30
    while not (tmp_path / "left").exists() and time.time() < deadline:
        if ended.exists() and ended.read_text().count("\n") > lines:
            break
        time.sleep(0.05)
    if (tmp_path / "left").exists():  # it began its work before the server ended it, or runs on
        pid, started = (tmp_path / "left").read_text().split()
        assert gone(int(pid), started)
    else:
        assert ended.read_text().count("\n") > lines  # its monitor ended and reaped it


def test_the_child_dies_with_the_test_process_that_asked_for_it(tmp_path: Path) -> None:
    """A test process killed mid-test (pytest's timeout) leaves no forked child running on."""
    asker = ("import sys, time, warm_start\n"
             "p = warm_start.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
             "env=warm_start._the_server().env)\n"
             "print(p.pid, p.warm, flush=True)\ntime.sleep(120)")
    process = subprocess.Popen([sys.executable, "-c", asker], stdout=subprocess.PIPE, text=True,
                               cwd=Path(__file__).parent,
                               env=subprocess_env(PYTHONPATH=str(Path(__file__).parent)))
    pid, warm = process.stdout.readline().split()
    started = start_tick(int(pid))
    assert warm == "True"
    process.kill()
    process.wait()
    assert gone(int(pid), started)


WARM_RANK = Path(__file__).with_name("warm_rank.py")
# One write per line: the two ranks share a pipe, and print's pieces (unbuffered) could interleave.
PROBE = ("import os, sys, time\n"
         "sys.stdout.write(f\"{os.environ.get('RANK')} {'torch' in sys.modules} {os.getpid()}\\n\")\n"
         "sys.stdout.flush()\ntime.sleep(float(sys.argv[1]))\n")


def test_torchrun_ranks_are_forked_warm_with_their_own_environment(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    env = subprocess_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               *warm_start.TORCHRUN_CAPTIONER[:-1], "probe", "0"]  # the same worker program, another module
    done = warm_start.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    ranks = sorted(line.split()[:2] for line in done.stdout.splitlines())
    assert ranks == [["0", "True"], ["1", "True"]]  # each rank had its RANK, and torch before it began: forked


def test_a_signal_to_the_worker_program_reaches_the_rank_and_ends_it_alike(tmp_path: Path) -> None:
    """torchrun (or a test) signals the process it started, which stands in for the forked rank."""
    (tmp_path / "probe.py").write_text(PROBE)
    warm_start.run([sys.executable, "-c", "pass"], env=subprocess_env())  # the server is up
    env = subprocess_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", RANK="1",
                         **{warm_start.SOCKET: warm_start._the_server().path})
    program = subprocess.Popen([sys.executable, "-S", "-u", str(WARM_RANK), "-m", "probe", "60"],
                               stdout=subprocess.PIPE,
                               text=True, env=env, cwd=tmp_path)
    rank, loaded, pid = program.stdout.readline().split()
    started = start_tick(int(pid))
    assert (rank, loaded) == ("1", "True") and int(pid) != program.pid
    program.send_signal(signal.SIGTERM)
    assert program.wait(timeout=60) == -signal.SIGTERM
    program.stdout.close()
    assert gone(int(pid), started)


def test_without_a_server_the_worker_program_becomes_the_command_itself(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    env = {k: v for k, v in subprocess_env(PYTHONPATH=str(tmp_path), RANK="0").items() if k != warm_start.SOCKET}
    done = subprocess.run([sys.executable, "-S", "-u", str(WARM_RANK), "-m", "probe", "0"],
                          capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    rank, loaded, pid = done.stdout.split()
    assert done.returncode == 0 and (rank, loaded) == ("0", "False")  # exec'd cold: nothing loaded before it


@pytest.mark.parametrize("warm", [True, False], ids=["with the server", "without"])
def test_a_program_on_stdin_runs_as_python_dash_would(tmp_path: Path, warm: bool) -> None:
    """A shell script's `python - ARGS <<PY` (scripts/quickstart.sh), through the worker program: forked warm, with
    only rank_environment()'s variables added to the script's own, or cold where there is no server."""
    program = "import sys\nprint(sys.argv[1:], 'torch' in sys.modules)\nsys.exit(3)\n"  # loaded before it: forked
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(__file__).parent)}
    env = {**base, **warm_start.rank_environment()} if warm else base
    done = subprocess.run([sys.executable, "-S", "-u", str(WARM_RANK), "-", "a", "b c"], input=program,
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 3 and done.stdout == f"['a', 'b c'] {warm}\n", done.stderr[-2000:]
