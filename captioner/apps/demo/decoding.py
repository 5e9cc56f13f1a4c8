"""Where the demo's batches decode: in a process of its own (the server's default), or in the caller's thread.
A beam search runs hundreds of small torch ops a caption, and each lets go of Python's GIL and takes it back;
beside the page's busy threads (Gradio's event loop, the pictures) every take-back can wait out the interpreter's
switch interval, and under load a batch took 2-3 times its own time (benchmarks demo_load). A process of its own
has a GIL of its own. It gets the loaded models once, pickled, and answers each batch with its captions or the
error decoding raised; the same `Captioner.caption` decodes either way. Run as a module, this file is that process."""

from __future__ import annotations

import gc
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np
import torch
from PIL import Image

import captioner
from captioner.core.decode_results import Caption
from captioner.core.errors import CaptionerError
from captioner.core.process_settings import threads_that_pay
from captioner.models.captioner import Captioner
from captioner.models.products import reused_weights

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0  # a closing process finishes its batch in this time, or is killed


class Decoder(Protocol):
    """What the batcher decodes a batch with."""

    def caption(self, model: Captioner, images: list[Image.Image], **options: Any) -> list[Caption]: ...

    def choose_threads(self, cores: int | None) -> tuple[int, dict[int, float]]: ...

    def close(self) -> None: ...


def choose_threads(models: list[Captioner], cores: int | None) -> tuple[int, dict[int, float]]:
    """Torch threads for the captions: `cores` is None keeps this process's count, else `threads_that_pay` on one
    caption by each model of a picture made here (seeded noise: no file is read). -> (threads, best s by count)."""
    if cores is None:
        return torch.get_num_threads(), {}
    picture = Image.fromarray(np.random.default_rng(0).integers(0, 256, (384, 512, 3), dtype=np.uint8))  # (H, W, 3)

    def one_request() -> None:
        for model in models:
            model.caption(picture, self_attention=model.decoder.has_self_attention)  # as the page asks

    return threads_that_pay(one_request, cores)


class LocalDecoder:
    """Decodes in the calling thread: for a page inside another program, and tests of the page alone."""

    def __init__(self, models: list[Captioner]) -> None:
        self.models = models

    def caption(self, model: Captioner, images: list[Image.Image], **options: Any) -> list[Caption]:
        return list(model.caption(images, **options))

    def choose_threads(self, cores: int | None) -> tuple[int, dict[int, float]]:
        return choose_threads(self.models, cores)

    def close(self) -> None:
        pass


class DecodeProcess:
    """Decodes in a child process (`python -m captioner.apps.demo.decoding`), started at the first request or by
    `start`. A child that dies while it decodes fails that batch with one line; the next request starts another."""

    def __init__(self, models: list[Captioner]) -> None:
        self.models = models
        self.threads: int | None = None  # set in the child: kept for a child started again
        self._child: subprocess.Popen | None = None
        self._ready = False  # the child has its models
        self._lock = threading.Lock()  # one request at a time on the pipes

    def start(self) -> None:
        """Start the child, which loads torch meanwhile; its models go with the first request."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._child is not None:
            if (code := self._child.poll()) is None:
                return
            log.warning("demo: the decoding process had stopped (exit code %s); starting another", code)
        self._child, self._ready = _PRESTARTED.pop() if _PRESTARTED else child_process(), False

    def _ask(self, request: tuple) -> Any:
        """Send one request, return its answer; the child's error is raised here."""
        with self._lock:
            self._start()
            child = self._child
            assert child is not None and child.stdin is not None and child.stdout is not None
            try:
                if not self._ready:
                    send(child.stdin, ("models", self.models, self.threads))
                    self._ready = True
                send(child.stdin, request)
                kind, value = pickle.load(child.stdout)
            except (OSError, EOFError, pickle.UnpicklingError):
                self._stop(child)  # waits for its exit code
                raise CaptionerError(f"demo: the decoding process stopped (exit code {child.returncode}); the next "
                                     "caption starts another") from None
        if kind == "error":
            raise value
        return value

    def caption(self, model: Captioner, images: list[Image.Image], **options: Any) -> list[Caption]:
        index = next((i for i, served in enumerate(self.models) if served is model), None)
        if index is None:
            raise ValueError("DecodeProcess.caption: a model this decoder was not given (its child has a copy of "
                             "each model it was built with)")
        return self._ask(("caption", index, images, options))

    def choose_threads(self, cores: int | None) -> tuple[int, dict[int, float]]:
        """As `choose_threads`, in the child; `cores` None: the threads of this process."""
        threads, best = self._ask(("threads", torch.get_num_threads() if cores is None else None, cores))
        self.threads = threads
        return threads, best

    def close(self) -> None:
        """End the child: its pipe closes and it exits after the batch it decodes, else it is killed. A child that
        stops answering mid-request is killed too, after the same grace: its request then fails in one line."""
        while not self._lock.acquire(timeout=CLOSE_TIMEOUT_S):  # a request in flight past the grace
            if (child := self._child) is not None:
                child.kill()  # the waiting request reads the end of its pipe, stops the child and lets go
        try:
            if self._child is not None:
                self._stop(self._child)
        finally:
            self._lock.release()

    def _stop(self, child: subprocess.Popen) -> None:
        end_child(child, CLOSE_TIMEOUT_S)
        self._child, self._ready = None, False


_PRESTARTED: list[subprocess.Popen] = []  # a child started by `prestart`, for the next DecodeProcess


def child_process(popen: Callable[..., subprocess.Popen] = subprocess.Popen) -> subprocess.Popen:
    """A new child, on this code whatever its path says, loading torch until its models arrive. `popen` starts it
    (the tests fork theirs from an interpreter that has loaded torch already)."""
    source = str(Path(captioner.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))}
    return popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)


def prestart() -> None:
    """Start the next DecodeProcess's child now: it loads torch (3 s) while the server loads its models and builds
    its page. One nobody takes ends with this process (its pipe closes), or with `discard_prestarted`."""
    if not _PRESTARTED:
        _PRESTARTED.append(child_process())


def end_child(child: subprocess.Popen, grace_s: float) -> None:
    """Close the child's pipes, so it exits after what it is doing; kill it if it has not within `grace_s`."""
    for pipe in (child.stdin, child.stdout):
        try:
            pipe.close()  # type: ignore[union-attr]
        except OSError:  # a broken pipe: the child is gone already
            pass
    try:
        child.wait(grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def discard_prestarted() -> None:
    """End a prestarted child nobody took (the server stopped before its page was built), at once."""
    while _PRESTARTED:
        end_child(_PRESTARTED.pop(), 0)


def send(pipe: BinaryIO, message: tuple) -> None:
    """Pickled whole before any byte is written: a message that cannot be pickled leaves the pipe as it was."""
    pipe.write(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
    pipe.flush()


def picklable(error: BaseException) -> BaseException:
    """`error` if it survives the pipe, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any failure to pickle
        return RuntimeError(f"{type(error).__name__}: {error}")


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """The child's loop: ("models", models, threads) first, then ("caption", index, images, options) or ("threads",
    count or None, cores or None), each answered ("ok", value) or ("error", exception); ends when the pipe closes.
    Its models never change: each dense weight is blocked for oneDNN once, not once a batch (8 ms a caption)."""
    with reused_weights():
        _serve(requests, answers)


def _serve(requests: BinaryIO, answers: BinaryIO) -> None:
    models: list[Captioner] = []
    while True:
        try:
            request = pickle.load(requests)
        except EOFError:
            return
        try:
            if request[0] == "models":
                models, threads = request[1], request[2]
                if threads:
                    torch.set_num_threads(threads)
                continue
            if request[0] == "caption":
                _, index, images, options = request
                value: Any = list(models[index].caption(images, **options))
            elif request[0] == "threads":
                _, count, cores = request
                if count:
                    torch.set_num_threads(count)
                value = choose_threads(models, cores)
            else:
                raise ValueError(f"unknown request {request[0]!r}")
            answer: tuple = ("ok", value)
        except Exception as e:  # noqa: BLE001 - the caller raises it
            answer = ("error", picklable(e))
        send(answers, answer)


def main() -> None:
    """The child: requests on standard input, answers on a copy of standard output, whose own descriptor then
    writes to standard error (a stray print cannot break the answers). Ctrl-C is the server's to handle: it closes
    the pipe, and the child ends after its batch."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, answers)
    gc.freeze()  # the exit the server waits for then skips collecting torch's objects (apps/cli.command_line)


if __name__ == "__main__":
    main()
