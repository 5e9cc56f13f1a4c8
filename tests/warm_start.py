"""The tests' Python child processes, forked from a warm interpreter instead of started cold.

A test that runs `python -m captioner train ...` in a child process pays about 4 CPU seconds before
the first line of captioner runs: importing torch and torchvision. The suite starts dozens of such
children, so each pytest worker keeps one server process that has imported them once (and run no
torch operation, so no thread pool exists to be lost in a fork), and forks it for each child:

    test --(command, env, cwd, its pipes' file descriptors)--> server
    server --fork--> monitor --fork--> child: the pipes become fds 0-2, then the command runs as
                                       `python -m ...`, `python -c ...` or `python script.py` would
    monitor --(the child's pid, then its wait status and CPU seconds)--> test

`run` and `Popen` take `subprocess`'s arguments and return what it returns, so a call site changes
one name. A command the server cannot stand for runs as a real subprocess: another interpreter, an
interpreter option other than -u/-B, keyword arguments outside the few handled, or an environment
that differs from the server's in a variable read when a library loads (PYTHON*, OMP_*, MKL_*,
TORCH*, LD_*, ...), since the server has already loaded them. Tests that check what a fresh
interpreter imports keep using `subprocess`. CAPTIONER_WARM_START=0 turns the server off.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Variables a library reads when it loads (the server loaded them under its own values) or that
# change how the interpreter itself starts: a request that sets them differently runs cold.
LOAD_TIME_PREFIXES = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS", "TORCH", "CUDA", "LD_",
                      "MALLOC_", "NUMEXPR_")
# Of those, the ones that are not: applied by the child itself (the first two), or read only when
# used (torch.hub reads TORCH_HOME at each call; torchrun's variables for its workers; the CUDA
# driver reads CUDA_VISIBLE_DEVICES when it starts, and the server starts no CUDA; inductor reads its
# cache folder at each use, and sets it where it is unset when torchvision loads, in the server or not).
READ_WHEN_USED = ("PYTHONUNBUFFERED", "PYTHONPATH", "TORCH_HOME", "TORCHELASTIC_", "TORCH_NCCL_",
                  "CUDA_VISIBLE_DEVICES", "TORCHINDUCTOR_CACHE_DIR")
# matplotlib (a core dependency: every training run draws its curves) is 0.4 of the 0.6 CPU s a training child
# spent importing before its first step.
PRELOAD = ("numpy", "PIL.Image", "yaml", "tqdm", "torch", "torchvision", "torchvision.models",
           "torchvision.transforms.v2", "matplotlib", "matplotlib.figure")
HANDLED_KWARGS = {"cwd", "env", "stdin", "stdout", "stderr", "text", "start_new_session", "encoding", "errors",
                  "universal_newlines"}
_HEADER = struct.Struct("!I")

SOCKET = "CAPTIONER_WARM_START_SOCKET"  # in a warm child's environment: where its server listens (tests/warm_rank.py)
# The end of a torchrun command whose ranks run `python -m captioner` forked warm:
# `python -m torch.distributed.run OPTIONS *TORCHRUN_CAPTIONER ARGS`. Its worker program is
# tests/warm_rank.py, run with -S: a site file of the test's (tests/torchrun_site.py) must run in
# the rank it stands for, not in it too.
TORCHRUN_CAPTIONER = ["--no-python", sys.executable, "-S", "-u", str(Path(__file__).with_name("warm_rank.py")), "-m",
                      "captioner"]


def forked_cpu() -> float:
    """CPU seconds of this process's server and of the children it forked that have ended
    (os.times() cannot see them: the server, not this process, is their parent; torchrun's warm
    ranks included); tests/suite_timeline.py adds them to the children's."""
    if _server is None:
        return 0.0
    try:
        ended = sum(float(line) for line in Path(_server.folder, "cpu").read_text().split())
    except OSError:
        ended = 0.0
    return _server.startup_cpu + ended


# ---------------------------------------------------------------- the wire: length-prefixed JSON


def _send(conn: socket.socket, message: dict, fds: Sequence[int] = ()) -> None:
    body = json.dumps(message).encode()
    header = _HEADER.pack(len(body))
    if fds:
        socket.send_fds(conn, [header], list(fds))
    else:
        conn.sendall(header)
    conn.sendall(body)


def _receive(conn: socket.socket, with_fds: int = 0) -> tuple[dict | None, list[int]]:
    fds: list[int] = []
    if with_fds:
        header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, with_fds)
    else:
        header = conn.recv(_HEADER.size)
    while header and len(header) < _HEADER.size:
        more = conn.recv(_HEADER.size - len(header))
        if not more:
            break
        header += more
    if len(header) < _HEADER.size:
        return None, fds
    (size,) = _HEADER.unpack(header)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            return None, fds
        body += chunk
    return json.loads(body), fds


def fork(path: str, kind: str, target: str, args: list[str], *, unbuffered: bool, cwd: str, env: Mapping[str, str],
         new_session: bool, fds: Sequence[int]) -> tuple[socket.socket, dict | None]:
    """Ask the server listening at `path` to fork `python -m target args` (kind "module"), `-c`
    ("code") or a script ("path"), with `fds` as its stdin, stdout and stderr: the connection, on
    which its wait status comes when it ends, and the reply, {"pid": ...} or {"cold": why}."""
    conn = ask(path, kind, target, args, unbuffered=unbuffered, cwd=cwd, env=env, new_session=new_session, fds=fds)
    reply, _ = _receive(conn)
    return conn, reply


def ask(path: str, kind: str, target: str, args: list[str], *, unbuffered: bool, cwd: str, env: Mapping[str, str],
        new_session: bool, fds: Sequence[int]) -> socket.socket:
    """`fork`'s request, sent: the connection, its reply not read yet."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    _send(conn, {"kind": kind, "target": target, "args": args, "unbuffered": unbuffered, "cwd": cwd, "env": dict(env),
                 "new_session": new_session}, fds)
    return conn


# ---------------------------------------------------------------- the server side


def serve(path: str) -> None:
    """Load the heavy modules, then fork one monitor per request until stdin closes (the test
    worker that started this server has exited)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors are reaped by the kernel
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [])
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1):
            return
        if listener in ready:
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                try:
                    _monitor(conn)
                finally:
                    os._exit(0)
            conn.close()


def _monitor(conn: socket.socket) -> None:
    request, fds = _receive(conn, with_fds=3)
    if request is None:
        return
    differ = _differences(os.environ, request["env"])
    if differ:  # only tests/warm_rank.py sends such a request: it then starts the command cold
        _send(conn, {"cold": differ})
        return
    pid = os.fork()
    if pid == 0:
        conn.close()
        _become(request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    # The test process may die first (killed by pytest's timeout, or a worker program signalled
    # before the pid came back): its end of the connection closes, and the child goes with it
    # rather than run on unwatched.
    try:
        _send(conn, {"pid": pid})
    except OSError:  # already closed: the loop below finds it so
        pass
    child, watching = os.pidfd_open(pid), [conn]
    while child not in select.select([child, *watching], [], [])[0]:
        if not _peer_alive(conn):
            os.kill(pid, signal.SIGKILL)
            watching = []
    _, status, usage = os.wait4(pid, 0)
    cpu = usage.ru_utime + usage.ru_stime
    with open(os.path.join(os.path.dirname(conn.getsockname()), "cpu"), "a") as log:
        log.write(f"{cpu}\n")  # one short append: whole, whichever monitor writes beside it
    try:
        _send(conn, {"status": status, "cpu": cpu})
    except OSError:
        pass


def _peer_alive(conn: socket.socket) -> bool:
    """False once the test process's end of the connection has closed (it sends nothing after the request)."""
    if not select.select([conn], [], [], 0)[0]:
        return True
    try:
        return conn.recv(1, socket.MSG_PEEK) != b""
    except OSError:
        return False


def _become(request: dict, fds: list[int]) -> None:
    """In the forked child: take the request's pipes, folder, environment and session, then run
    its command as the interpreter would and exit with its status."""
    status = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        if request["new_session"]:
            os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        server_pythonpath = os.environ.get("PYTHONPATH", "")
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # computed again from this environment's TMPDIR
        _take_pythonpath(server_pythonpath, os.environ.get("PYTHONPATH", ""))
        unbuffered = request["unbuffered"] or bool(os.environ.get("PYTHONUNBUFFERED"))
        # buffered as the interpreter's own: a raw pipe's read(n) may return less (pickle.load(sys.stdin.buffer))
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=unbuffered,
                                      line_buffering=False)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                      line_buffering=True, write_through=unbuffered)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()  # a cold start draws its own seed; a fork would share the server's
        status = _run_as_main(request["kind"], request["target"], request["args"])
    # whatever happens, the child must exit here, never return to the server's loop
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    os._exit(status)


def _take_pythonpath(server: str, wanted: str) -> None:
    """sys.path as this child's PYTHONPATH would have made it: the server's entries out, the
    child's in, where the interpreter puts them (after the script's folder, before the site's)."""
    drop = {os.path.abspath(p) for p in server.split(os.pathsep) if p}
    rest = [p for p in sys.path[1:] if os.path.abspath(p) not in drop]
    sys.path[1:] = [p for p in wanted.split(os.pathsep) if p] + rest
    # The interpreter imports `sitecustomize` from its path at start-up: one that this path finds
    # and the server's did not (the torchrun tests' site file) runs now.
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path[1:])
    loaded = getattr(sys.modules.get("sitecustomize"), "__file__", None)
    if spec is not None and spec.origin != loaded:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


def _print_traceback(error: BaseException) -> None:
    """The traceback the interpreter would print: without this module's own frames."""
    import traceback

    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    traceback.print_exception(type(error), error, tb)


def _run_as_main(kind: str, target: str, args: list[str]) -> int:
    """Run `python -m target args`, `python -c target args` or `python target args` in this
    process, then what the interpreter does at exit; the exit status."""
    import atexit
    import runpy
    import threading as threads
    import types

    sys.modules["__main__"] = types.ModuleType("__main__")
    status, interrupted = 0, False
    try:
        if kind == "module":
            sys.argv = ["-m", *args]
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(target, alter_argv=True)  # what `python -m` itself calls
        elif kind == "code":
            sys.argv = ["-c", *args]
            sys.path[0] = ""
            exec(compile(target, "<string>", "exec"), sys.modules["__main__"].__dict__)
        else:
            sys.argv = [target, *args]
            sys.path[0] = str(Path(target).resolve().parent)
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        status = _exit_status(e.code)
    except KeyboardInterrupt as e:
        _print_traceback(e)
        status, interrupted = 130, True
    except BaseException as e:  # noqa: BLE001 - as the interpreter does: the traceback, then status 1
        _print_traceback(e)
        status = 1
    threads._shutdown()  # the interpreter waits for non-daemon threads, then runs atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:  # an unhandled Ctrl-C ends the interpreter by SIGINT itself
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return status


def _exit_status(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


# ---------------------------------------------------------------- the test side


class _Server:
    """This process's server: started at the first request, ended when this process exits."""

    def __init__(self) -> None:
        from helpers import REPO, subprocess_env

        self.folder = tempfile.mkdtemp(prefix="captioner-warm-")
        self.path = os.path.join(self.folder, "socket")
        self.env = subprocess_env()
        self.process = subprocess.Popen([sys.executable, __file__, self.path], cwd=REPO, env=self.env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the warm interpreter did not start (exit {self.process.wait()})")
        self.startup_cpu = _process_cpu(self.process.pid)  # its imports, paid once for every child it forks

    def stands_for(self, env: Mapping[str, str]) -> bool:
        return not _differences(self.env, env)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)


def proc_stat(pid: int) -> list[str]:
    """The fields of Linux's /proc/PID/stat after the command's name: the process's state first."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _process_cpu(pid: int) -> float:
    """CPU seconds a running process has used so far (Linux's /proc; 0 where there is none)."""
    try:
        fields = proc_stat(pid)
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, ValueError, IndexError):
        return 0.0


def _read_at_load(name: str) -> bool:
    return name.startswith(LOAD_TIME_PREFIXES) and not name.startswith(READ_WHEN_USED)


def _differences(server: Mapping[str, str], wanted: Mapping[str, str]) -> list[str]:
    """The variables read at load whose values differ between the server's environment and the wanted one."""
    return sorted(k for k in {*server, *wanted} if _read_at_load(k) and server.get(k) != wanted.get(k))


_server: _Server | None = None
_server_lock = threading.Lock()


def _the_server() -> _Server:
    global _server
    with _server_lock:
        if _server is None or _server.process.poll() is not None:
            import atexit

            _server = _Server()
            atexit.register(_server.close)
        return _server


def _parse(command: Sequence[str]) -> tuple[str, str, list[str], bool] | None:
    """(kind, target, args, unbuffered) of `python [-u] [-B] (-m MOD | -c CODE | SCRIPT) ARGS`, or
    None for anything else."""
    words = [str(w) for w in command]
    if not words or os.path.realpath(words[0]) != os.path.realpath(sys.executable):
        return None
    unbuffered, i = False, 1
    while i < len(words) and words[i] in ("-u", "-B"):
        unbuffered |= words[i] == "-u"
        i += 1
    if i >= len(words):
        return None
    if words[i] in ("-m", "-c"):
        if i + 1 >= len(words):
            return None
        return ("module" if words[i] == "-m" else "code"), words[i + 1], words[i + 2:], unbuffered
    if words[i].startswith("-"):
        return None
    return "path", words[i], words[i + 1:], unbuffered


def rank_environment() -> dict[str, str]:
    """What a grandchild (a shell script's `python`) needs in its environment, whatever else it has, for
    tests/warm_rank.py to have this worker's server fork its command: where the server listens, and the server's
    own variables read at load. Nothing where the server is off: warm_rank.py then runs the command cold."""
    if not _enabled():
        return {}
    server = _the_server()
    return {**{name: value for name, value in server.env.items() if _read_at_load(name)}, SOCKET: server.path}


def _enabled() -> bool:
    return os.environ.get("CAPTIONER_WARM_START", "1") != "0" and hasattr(socket, "send_fds") and hasattr(os, "fork")


class Popen:
    """What `subprocess.Popen(command, **kwargs)` gives, the child forked from the warm server
    when it can stand for the command (`warm`), else a real subprocess behind the same methods."""

    def __init__(self, command: Sequence[str], **kwargs: Any) -> None:
        self.args = command
        parsed = _parse(command) if _enabled() and set(kwargs) <= HANDLED_KWARGS else None
        env = dict(kwargs.get("env") if kwargs.get("env") is not None else os.environ)
        server = _the_server() if parsed is not None else None
        self.warm = server is not None and server.stands_for(env)
        if os.environ.get("CAPTIONER_WARM_START_LOG"):  # which commands ran cold, and why
            why = "warm" if self.warm else ("not python, or options" if parsed is None
                                            else f"environment: {_differences(server.env, env)}")
            with open(os.environ["CAPTIONER_WARM_START_LOG"], "a") as log:
                log.write(
                    f"{why}\t{os.environ.get('PYTEST_CURRENT_TEST', '')}\t{' '.join(map(str, command))[:200]!r}\n")
        if not self.warm:
            self._cold = subprocess.Popen(command, **kwargs)
            self.pid, self.stdin, self.stdout, self.stderr = (self._cold.pid, self._cold.stdin, self._cold.stdout,
                                                              self._cold.stderr)
            return
        self._cold = None
        self._returncode: int | None = None
        self._text = bool(kwargs.get("text") or kwargs.get("universal_newlines") or kwargs.get("encoding")
                          or kwargs.get("errors"))
        self._encoding, self._errors = kwargs.get("encoding") or "utf-8", kwargs.get("errors") or "strict"
        ends, mine = [], []
        for name, default_fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
            ends.append(self._end(name, kwargs.get(name), default_fd, mine))
        # stderr=STDOUT: the child's fd 2 is its fd 1
        if kwargs.get("stderr") == subprocess.STDOUT:
            ends[2] = ends[1]
        self.cpu = 0.0
        kind, target, args, unbuffered = parsed
        cwd = os.fspath(kwargs["cwd"]) if kwargs.get("cwd") is not None else os.getcwd()
        self._conn, reply = fork(server.path, kind, target, args, unbuffered=unbuffered, cwd=cwd,
                                 env={**env, SOCKET: server.path},
                                 new_session=bool(kwargs.get("start_new_session")), fds=ends)
        for fd in mine:
            os.close(fd)
        if reply is None:
            raise RuntimeError("the warm interpreter did not fork the child")
        self.pid = reply["pid"]

    def _end(self, name: str, spec: Any, default_fd: int, mine: list[int]) -> int:
        """The fd the child gets for `name`; a pipe's other end becomes this object's attribute."""
        setattr(self, name, None)
        if spec is None:
            return default_fd
        if spec == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR)
            mine.append(fd)
            return fd
        if spec == subprocess.PIPE:
            read, write = os.pipe()
            if name == "stdin":
                mine.append(read)
                setattr(self, name, self._wrap(open(write, "wb", buffering=0), writing=True))
                return read
            mine.append(write)
            setattr(self, name, self._wrap(open(read, "rb", buffering=0), writing=False))
            return write
        if spec == subprocess.STDOUT:
            return 1
        return spec if isinstance(spec, int) else spec.fileno()

    def _wrap(self, raw: io.RawIOBase, writing: bool) -> Any:
        if not self._text:  # buffered as subprocess's pipes: a raw write a signal interrupts returns part written
            return io.BufferedWriter(raw) if writing else io.BufferedReader(raw)
        if writing:
            return io.TextIOWrapper(io.BufferedWriter(raw), encoding=self._encoding, errors=self._errors,
                                    write_through=True)
        return io.TextIOWrapper(io.BufferedReader(raw), encoding=self._encoding, errors=self._errors)

    # ------------------------------------------------------------ Popen's methods

    @property
    def returncode(self) -> int | None:
        return self._cold.returncode if self._cold is not None else self._returncode

    def poll(self) -> int | None:
        if self._cold is not None:
            return self._cold.poll()
        if self._returncode is None and select.select([self._conn], [], [], 0)[0]:
            self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self._cold is not None:
            return self._cold.wait(timeout)
        if self._returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._finish()
        return self.returncode

    def _finish(self) -> None:
        reply, _ = _receive(self._conn)
        self._conn.close()
        if reply is None:
            raise RuntimeError(f"the warm interpreter's monitor of pid {self.pid} ended without its status")
        self._returncode = os.waitstatus_to_exitcode(reply["status"])
        self.cpu = reply["cpu"]

    def send_signal(self, sig: int) -> None:
        if self._cold is not None:
            self._cold.send_signal(sig)
        elif self._returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: str | bytes | None = None, timeout: float | None = None) -> tuple[Any, Any]:
        if self._cold is not None:
            return self._cold.communicate(input, timeout)
        results: dict[str, Any] = {}

        def drain(name: str) -> None:
            stream = getattr(self, name)
            results[name] = stream.read()  # text mode reads with universal newlines, as subprocess's does
            stream.close()

        readers = [threading.Thread(target=drain, args=(name,), daemon=True) for name in ("stdout", "stderr")
                   if getattr(self, name)]
        for reader in readers:
            reader.start()
        if self.stdin is not None:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except BrokenPipeError:
                pass
        self.wait(timeout)
        for reader in readers:
            reader.join(timeout)
            if reader.is_alive():  # a grandchild still holds the pipe open
                raise subprocess.TimeoutExpired(self.args, timeout)
        return results.get("stdout"), results.get("stderr")

    def __enter__(self) -> Popen:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr, self.stdin):
            if stream is not None:
                stream.close()
        self.wait()


def run(command: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """What `subprocess.run(command, **kwargs)` gives (capture_output, input, timeout and check
    included), the child forked from the warm server when it can stand for the command."""
    timeout, given, check = kwargs.pop("timeout", None), kwargs.pop("input", None), kwargs.pop("check", False)
    if kwargs.pop("capture_output", False):
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if given is not None:
        kwargs["stdin"] = subprocess.PIPE
    process = Popen(command, **kwargs)
    try:
        out, err = process.communicate(given, timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    result = subprocess.CompletedProcess(command, process.returncode, out, err)
    if check:
        result.check_returncode()
    return result


if __name__ == "__main__":
    serve(sys.argv[1])
    # The interpreter's own exit would tear down torch's modules and objects, about 1.5 s the test worker
    # waits for at the suite's end; this process has nothing to flush or finalise.
    os._exit(0)
