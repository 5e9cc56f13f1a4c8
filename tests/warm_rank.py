"""torchrun's worker in the tests: `python -S -u tests/warm_rank.py -m captioner ARGS` has the test
worker's warm server (tests/warm_start.py) fork `python -m captioner ARGS` with this process's
environment (RANK, WORLD_SIZE, ...), folder and stdio, stands in for it (the signals torchrun or a
test sends are passed on), and exits as it exits. Without a server, or where the server cannot
stand for this environment, it becomes `python -u -m captioner ARGS` itself (exec). `- ARGS` stands for
`python - ARGS` the same way: the program read from stdin, run as `-c` (a shell script's heredoc)."""

from __future__ import annotations

import os
import signal
import sys

import warm_start

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def cold(command: list[str]) -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)  # one held meanwhile acts here as on the command
    os.execv(sys.executable, [sys.executable, "-u", *command])


def main() -> None:
    command = sys.argv[1:]
    if command[:1] == ["-"]:
        command = ["-c", sys.stdin.read(), *command[1:]]
    path = os.environ.get(warm_start.SOCKET)
    if not path or len(command) < 2 or command[0] not in ("-m", "-c"):
        cold(command)
    # A signal that comes before the child's pid is known is held, then passed on (or, cold, kept
    # for the command this process becomes): the rank never misses what torchrun sent it.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        kind = "module" if command[0] == "-m" else "code"
        conn, reply = warm_start.fork(path, kind, command[1], command[2:], unbuffered=True, cwd=os.getcwd(),
                                      env=os.environ,
                                      new_session=False, fds=[0, 1, 2])
    except OSError:  # no server listens there any more
        cold(command)
    if reply is None or "cold" in reply:
        conn.close()
        cold(command)
    pid = reply["pid"]
    def forward(sig: int, frame: object) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # it has just ended: its status is on the way
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    reply, _ = warm_start._receive(conn)  # the child's end (a forwarded signal interrupts and resumes this wait)
    code = os.waitstatus_to_exitcode(reply["status"]) if reply else 1
    if code < 0:  # ended by a signal: end by the same one
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
