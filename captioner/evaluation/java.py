"""pycocoevalcap's Java side: the runtime check and the Java tools, run with bounds. A tool that exits
or stays silent too long is one `JavaToolError` naming it, and its process is always killed and
reaped, its pipes and files closed, whatever happens."""

from __future__ import annotations

import contextlib
import fcntl
import io
import logging
import os
import re
import selectors
import shutil
import subprocess
import tempfile
import time
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from captioner.core.errors import CaptionerError

logger = logging.getLogger(__name__)

# What the official metrics need, said alike by every refusal.
JAVA_NEEDED = ("the official COCO metrics (PTB tokenizer, METEOR, SPICE) need Java 17, as tested "
               "(any Java 8+ runtime on PATH runs them)")
JAVA_INSTALL = "Debian/Ubuntu: apt-get install openjdk-17-jre-headless"
JAVA_MISSING = f"Java not found: {JAVA_NEEDED}; install it ({JAVA_INSTALL})"

# Java 9+ refuses the reflection SPICE's parse cache (FST) relies on, and SPICE dies with
# InaccessibleObjectException; these are the fewest packages to open for Java 17. Java 8 ignores them.
_SPICE_JAVA_OPTIONS = " ".join(f"--add-opens=java.base/{package}=ALL-UNNAMED" for package in
                               ("java.lang", "java.math", "java.util", "java.util.concurrent", "java.net", "java.text"))

# The client compiler and the serial collector for the tools that run here (PTB tokenizer, METEOR and its
# normaliser): their work is single-threaded, so the server compiler's and G1's threads cost more than they give.
# The tokenizer on COCO val2014's 202,654 references: 0.8-1.0 Java CPU s against 2.6-3.8, the same lines
# (`python -m benchmarks metrics --tokenizer-rounds 5`).
JVM_OPTIONS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]

# Line ends for the Java PTB tokenizer (-preserveLines) besides "\n": one inside a caption would
# shift every later caption onto the wrong image, so they become spaces.
_LINE_BREAKS = re.compile("[\r\u2028\u2029\x0b\x0c\x85]")


def one_line(caption: str) -> str:
    """The caption with every character the Java PTB tokenizer reads as a line end made a space."""
    return _LINE_BREAKS.sub(" ", caption)


class JavaToolError(CaptionerError):
    """A Java tool of the official metrics died, hung or answered something unexpected."""


# The longest a Java tool may stay silent (no output, no input taken) before it counts as hung. METEOR
# is silent while loading its paraphrase table (a minute on a heavily loaded core), so this is generous.
STALL_TIMEOUT_S = 300.0
# A tool run to completion (the PTB tokenizer) gets this long plus PER_LINE_TIMEOUT_S per input line.
RUN_TIMEOUT_S = 120.0
PER_LINE_TIMEOUT_S = 0.002
# SPICE parses every caption with CoreNLP in one run: minutes for 5,000 images, so an hour means it hangs.
SPICE_TIMEOUT_S = 3600.0
# While many answers are to come, `exchange` lets the pipes (enlarged to PIPE_BYTES) fill this long
# between reads: waking for each of METEOR's lines would take the GIL from the other metrics' thread.
BATCH_WAIT_S = 0.05
BATCH_MIN_LINES = 256
PIPE_BYTES = 1 << 20


def java_executable() -> str:
    """The `java` on PATH, or CaptionerError saying how to get one."""
    java = shutil.which("java")
    if java is None:
        raise CaptionerError(JAVA_MISSING)
    return java


def java_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (else this process's) for a Java child, in a UTF-8 locale where it names none: under
    LANG=C Java finds no folder named beyond ASCII and mangles such letters in captions."""
    env = dict(os.environ if env is None else env)
    current = env.get("LC_ALL") or env.get("LC_CTYPE") or env.get("LANG") or ""
    if not re.search(r"utf-?8", current, re.IGNORECASE):
        env["LC_ALL"] = "C.UTF-8"
    return env


def check_java() -> str:
    """Check that `java` is on PATH, runs, and is version 8 or newer; return its version line."""
    java = java_executable()
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, env=java_environment())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CaptionerError(f"Java at {java} does not run ({e}); {JAVA_NEEDED} ({JAVA_INSTALL})") from None
    output = ((proc.stderr or "") + (proc.stdout or "")).strip()
    if proc.returncode != 0:
        last = output.splitlines()[-1] if output else "no output"
        raise CaptionerError(f"Java at {java} fails to start ({last}); {JAVA_NEEDED} ({JAVA_INSTALL})")
    first = output.splitlines()[0] if output else "unknown version"
    match = re.search(r'version "(?:1\.)?(\d+)', output)  # "1.8.0_242" is Java 8, "17.0.2" Java 17
    if match and int(match.group(1)) < 8:
        raise CaptionerError(f"Java at {java} is too old ({first}); {JAVA_NEEDED} ({JAVA_INSTALL})")
    return first


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("NOTE:")]
    return lines[-1] if lines else "no error output"


def run_java(name: str, args: Sequence[str], cwd: str | os.PathLike[str], lines: int, stdin: str = "") -> str:
    """Run `java args` (after JVM_OPTIONS) in `cwd` to completion on `stdin` and return its stdout; `lines` (the
    input's size) scales the time limit. A non-zero exit or the time limit is one JavaToolError."""
    timeout = RUN_TIMEOUT_S + PER_LINE_TIMEOUT_S * lines
    try:
        proc = subprocess.run([java_executable(), *JVM_OPTIONS, *args], cwd=cwd, capture_output=True, encoding="utf-8",
                              errors="replace", timeout=timeout, input=stdin, env=java_environment())
    except subprocess.TimeoutExpired:  # subprocess.run has killed and reaped it
        raise JavaToolError(f"{name} failed: the Java process did not finish within {timeout:.0f} s "
                            "and was stopped") from None
    log_output(name, proc.stderr)
    if proc.returncode != 0:
        raise JavaToolError(f"{name} failed: the Java process exited with status {proc.returncode} "
                            f"({_last_line(proc.stderr)})")
    return proc.stdout


class LineTool:
    """A running Java program, `java args` after JVM_OPTIONS, that answers lines on stdin with lines on stdout
    (METEOR's -stdio); stderr goes to a temporary file, so it never blocks on a full pipe."""

    def __init__(self, name: str, args: Sequence[str], cwd: str | os.PathLike[str]) -> None:
        self.name = name
        self._stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen([java_executable(), *JVM_OPTIONS, *args], cwd=cwd, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._stderr, bufsize=0, env=java_environment())
        except BaseException:
            self._stderr.close()
            raise
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError, AttributeError):  # Linux only; the default size works too
                fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # type: ignore[union-attr]

    def kill(self) -> None:
        """Stop the process now (safe from another thread, and when it has already exited)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    def close(self) -> None:
        """Kill the process if it still runs, reap it, close its pipes and its stderr file."""
        self.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        log_output(self.name, self.stderr_text())
        self._stderr.close()

    def stderr_text(self) -> str:
        if self._stderr.closed:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def died(self, received: int, expected: int) -> JavaToolError:
        """The error for a process that closed its output after `received` of `expected` lines."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        code = self.proc.returncode
        status = "closed its output" if code is None else "was killed" if code < 0 else f"exited with status {code}"
        return JavaToolError(f"{self.name} failed: the Java process {status} after {received} of {expected} "
                             f"answers ({_last_line(self.stderr_text())})")


def exchange(tools: Sequence[LineTool], requests: Sequence[tuple[bytes, int]]) -> list[list[bytes]]:
    """Send tool k requests[k]'s bytes and read back the number of lines it names, from all tools at
    once (non-blocking pipes: none waits on another); each tool's lines, without line ends. A tool
    that exits or stalls for `STALL_TIMEOUT_S` raises JavaToolError; the caller closes the tools."""
    pending = [memoryview(data) for data, _ in requests]
    received = [bytearray() for _ in tools]
    counts = [0] * len(tools)
    with selectors.DefaultSelector() as selector:
        for k, tool in enumerate(tools):
            assert tool.proc.stdin is not None and tool.proc.stdout is not None
            if pending[k]:
                os.set_blocking(tool.proc.stdin.fileno(), False)
                selector.register(tool.proc.stdin, selectors.EVENT_WRITE, (k, "write"))
            if requests[k][1] > 0:
                selector.register(tool.proc.stdout, selectors.EVENT_READ, (k, "read"))
        while selector.get_map():
            events = selector.select(timeout=STALL_TIMEOUT_S)
            if not events:
                k = next(key.data[0] for key in selector.get_map().values())
                tools[k].kill()
                raise JavaToolError(f"{tools[k].name} failed: the Java process gave no answer for "
                                    f"{STALL_TIMEOUT_S:g} s ({counts[k]} of {requests[k][1]} answers) and was stopped")
            for key, _ in events:
                k, direction = key.data
                if direction == "write":
                    try:
                        written = os.write(key.fd, pending[k][: 1 << 16])
                    except BrokenPipeError:
                        raise tools[k].died(counts[k], requests[k][1]) from None
                    pending[k] = pending[k][written:]
                    if not pending[k]:
                        selector.unregister(key.fileobj)
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    raise tools[k].died(counts[k], requests[k][1])
                received[k] += chunk
                counts[k] += chunk.count(b"\n")
                if counts[k] >= requests[k][1]:
                    selector.unregister(key.fileobj)
            if any(requests[k][1] - counts[k] >= BATCH_MIN_LINES for k in range(len(tools))):
                time.sleep(BATCH_WAIT_S)
    answers = []
    for k, tool in enumerate(tools):
        lines = bytes(received[k]).split(b"\n")[:-1]
        if len(lines) != requests[k][1]:
            raise JavaToolError(f"{tool.name} failed: expected {requests[k][1]} answers, got {len(lines)}")
        answers.append(lines)
    return answers


def log_output(name: str, output: str | bytes | None) -> None:
    if isinstance(output, bytes):
        output = output.decode("utf-8", "replace")
    for line in (output or "").splitlines():
        if line.strip():
            logger.debug("%s: %s", name, line.rstrip())


class _LoggedPopen(subprocess.Popen):  # type: ignore[type-arg]
    """Popen that also pipes stderr (unless told otherwise) and logs it when communicate() ends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs["env"] = java_environment(kwargs.get("env"))
        super().__init__(*args, **kwargs)

    def communicate(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        out, err = super().communicate(*args, **kwargs)
        log_output("java", err)
        return out, err


def _spice_check_call(cmd: list[str], **kwargs: Any) -> int:
    """Stand-in for `subprocess.check_call` in pycocoevalcap's SPICE wrapper: same command, with
    its output captured into the log, the Java 9+ options, and a one-line error if it fails."""
    env = java_environment(kwargs.pop("env", None))
    env["JDK_JAVA_OPTIONS"] = f"{env.get('JDK_JAVA_OPTIONS', '')} {_SPICE_JAVA_OPTIONS}".strip()
    cwd = Path(kwargs.get("cwd") or ".")

    def remove_temporary_files() -> None:  # pycocoevalcap removes its input/output files only on success
        for arg in cmd:
            candidate = cwd / arg
            if candidate.parent.name == "tmp" and candidate.is_file():
                candidate.unlink(missing_ok=True)

    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=env, timeout=SPICE_TIMEOUT_S,
                              **kwargs)
    except subprocess.TimeoutExpired:  # subprocess.run has killed and reaped it
        remove_temporary_files()
        raise JavaToolError(f"SPICE failed: the Java process did not finish within {SPICE_TIMEOUT_S:.0f} s "
                            "and was stopped") from None
    log_output("spice", proc.stdout)
    log_output("spice", proc.stderr)
    if proc.returncode != 0:
        remove_temporary_files()
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip() and not line.startswith("NOTE:")]
        causes = ([line for line in lines if line.startswith("Caused by:")]
                  or [line for line in lines if "Exception" in line or "Error" in line])
        reason = (causes or lines or ["no error output"])[-1]
        raise JavaToolError(f"SPICE failed (java exit status {proc.returncode}): {reason}")
    return 0


@contextlib.contextmanager
def quiet_pycocoevalcap() -> Iterator[io.StringIO]:
    """Capture pycocoevalcap's prints and its Java tools' stderr (by swapping the name `subprocess`
    in its tokenizer and SPICE modules) for the duration. Not thread-safe."""
    from pycocoevalcap.spice import spice as spice_module
    from pycocoevalcap.tokenizer import ptbtokenizer

    quiet = types.SimpleNamespace(PIPE=subprocess.PIPE, Popen=_LoggedPopen, check_call=_spice_check_call)
    saved = ptbtokenizer.subprocess, spice_module.subprocess
    ptbtokenizer.subprocess = spice_module.subprocess = quiet  # type: ignore[assignment]
    stdout = io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout):
            yield stdout
    finally:
        ptbtokenizer.subprocess, spice_module.subprocess = saved
        log_output("pycocoevalcap", stdout.getvalue())
