"""Tiny models and data for unit tests."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from captioner.core.config import load_config
from captioner.core.config_sections import Config
from captioner.models.captioner import Captioner
from captioner.text.vocab import Vocabulary

WORDS = "a small large red blue green circle square star left right of above below".split()


def tiny_vocab() -> Vocabulary:
    return Vocabulary.build([" ".join(WORDS)])


# A model of a few thousand weights on 32 px images, as overrides (for configs and command lines).
TINY_MODEL = [
    "data.image_size=32",
    "model.encoder.width=8",
    "model.decoder.embed_dim=16",
    "model.decoder.hidden_dim=24",
    "model.decoder.attention_dim=12",
    "model.decoder.d_model=16",
    "model.decoder.num_heads=2",
    "model.decoder.ff_dim=32",
]


def tiny_config(*overrides: str) -> Config:
    return load_config(None, [*TINY_MODEL, "model.decoder.dropout=0.1", *overrides])


def tiny_model(*overrides: str, seed: int = 0) -> Captioner:
    import torch

    torch.manual_seed(seed)
    return Captioner.from_config(tiny_config(*overrides), tiny_vocab()).eval()


# Headless in CI's container: no sandbox, no GPU, nothing fetched in the background.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


@contextmanager
def chromium_browser(executable: Path) -> Iterator:
    """The system Chromium at `executable`, started by a playwright driver for a browser test, and closed with its
    driver after it. It gets a UTF-8 locale: Chromium reads file names in the locale's charset, and under LANG=C it
    cannot open an upload named beyond ASCII."""
    require_module("playwright", "playwright is not installed (pip install playwright)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:  # stops the driver on the way out
        browser = playwright.chromium.launch(executable_path=str(executable), args=CHROMIUM_ARGS,
                                             env={**os.environ, "LC_ALL": "C.UTF-8"})
        try:
            yield browser
        finally:
            browser.close()


def edit_json(path: Path, change: dict) -> None:
    """Set `change`'s dotted keys ("spec.grid": the grid inside the spec) in the JSON file at `path`."""
    data = json.loads(path.read_text())
    for dotted, value in change.items():
        *parents, key = dotted.split(".")
        target = data
        for name in parents:
            target = target[name]
        target[key] = value
    path.write_text(json.dumps(data))

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
REPO = Path(__file__).resolve().parents[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a `captioner` or torchrun child process in a test: this checkout
    first on the path, and one thread per process (several run at once on a few cores, and
    more threads than cores only contend)."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "CAPTIONER_THREADS": "1", **extra}


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This test run's temporary folder, shared by its pytest-xdist workers (each has its own below
    it): what is built there once, under a file lock, serves every worker."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def require(available: bool, reason: str) -> None:
    """Skip the calling test when something it needs is missing, except in CI (CI=true), where a
    skip would let a green run hide that the test never ran: there it fails."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"CI=true and a test's requirement is missing: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


# What a test may lack even in CI, by name: things no CI machine of this project can have. Each
# still skips through `optional`, and the skip line says it is optional and why.
OPTIONAL_IN_CI = {
    "SPICE models": "Stanford CoreNLP 3.6.0's models download at SPICE's first run, and CI has no internet",
}


def optional(available: bool, name: str, reason: str) -> None:
    """Skip the calling test when `name` (a key of OPTIONAL_IN_CI) is missing, in CI too, with a
    reason that names it as optional there; anything else a test needs goes through `require`."""
    if available:
        return
    why = OPTIONAL_IN_CI[name]  # a KeyError here: name it in OPTIONAL_IN_CI, or use `require`
    pytest.skip(f"{reason} (optional, also in CI: {name}: {why})")


def require_module(name: str, reason: str) -> None:
    require(importlib.util.find_spec(name) is not None, reason)


def best_by_enumeration(decoder, feat, words: list[int], bos: int, eos: int, max_length: int,
                        alpha: float) -> tuple[list[int], float]:
    """The caption beam search should return when its beam holds every hypothesis: each
    sequence of `words` ended by <eos> within `max_length` steps, and each of `max_length` words
    cut off there (it competes with the same score), scored by teacher forcing (independently of
    the search's cached steps) and ranked by log-probability divided by GNMT's
    ((5 + length) / 6) ** alpha. feat (N, D). Returns (tokens, score)."""
    import itertools

    import torch

    ended = [(list(s), True) for n in range(max_length) for s in itertools.product(words, repeat=n)]
    cut_off = [(list(s), False) for s in itertools.product(words, repeat=max_length)]
    best: tuple[list[int], float] = ([], float("-inf"))
    with torch.no_grad():
        for tokens, finished in ended + cut_off:
            ids = torch.tensor([bos, *tokens] + ([eos] if finished else []))  # (T+1,) or (T+2,)
            logits = decoder(feat[None], ids[None, :-1]).logits[0]  # (T or T+1, V)
            logprob = float(logits.float().log_softmax(-1).gather(1, ids[1:, None]).sum())
            score = logprob / ((5.0 + len(tokens)) / 6.0) ** alpha
            if score > best[1]:
                best = (tokens, score)
    return best


def assert_beam_ranks_by_length_penalty(decoder, feats, bos: int, eos: int) -> None:
    """Beam search with a beam holding every hypothesis (words 3 and 4, up to 4 of them) returns,
    for each of `feats` (B, N, D), the caption `best_by_enumeration` finds, with its score, for
    alpha 0, 0.7 and 2; and the winner changes with alpha (longer for 2), so a search that
    ignored alpha would fail."""
    from captioner.models.decoding import DecodeOptions, SpecialTokens, beam_search

    winners = {}
    for alpha in (0.0, 0.7, 2.0):
        hyps = beam_search(decoder, feats, SpecialTokens(bos, eos, (0, bos)),
                           DecodeOptions(beam_size=32, max_length=5, length_penalty=alpha))
        expected = [best_by_enumeration(decoder, feat, [3, 4], bos=bos, eos=eos, max_length=5, alpha=alpha)
                    for feat in feats]
        assert [h.tokens for h in hyps] == [tokens for tokens, _ in expected], alpha
        assert [h.score for h in hyps] == pytest.approx([score for _, score in expected], abs=1e-4)
        winners[alpha] = [h.tokens for h in hyps]
    flips = sum(a != b for a, b in zip(winners[0.0], winners[2.0]))
    assert flips >= 2 and all(len(b) >= len(a) for a, b in zip(winners[0.0], winners[2.0]))


def count_panels(png, min_side: int = 40) -> int:
    """The number of picture panels in a saved figure (the input image and one heatmap per word):
    connected regions of non-white pixels at least `min_side` pixels on each side that fill most
    of their bounding box. Titles and captions are text, whose strokes are thin and sparse, so
    they never count. Works on the file itself, so it checks what a user would see."""
    from collections import deque

    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(png).convert("L"), dtype=np.int16)  # (H, W)
    cell = 4  # blocks of 4x4 pixels: a block is ink when most of it is not white
    h, w = pixels.shape[0] // cell, pixels.shape[1] // cell
    blocks = (pixels[: h * cell, : w * cell] < 245).reshape(h, cell, w, cell).mean(axis=(1, 3)) > 0.5  # (h, w)
    seen = np.zeros_like(blocks)
    panels = 0
    for y0, x0 in zip(*np.nonzero(blocks)):
        if seen[y0, x0]:
            continue
        seen[y0, x0] = True
        queue, area, ys, xs = deque([(y0, x0)]), 0, [y0, y0], [x0, x0]
        while queue:
            y, x = queue.popleft()
            area += 1
            ys[0], ys[1], xs[0], xs[1] = min(ys[0], y), max(ys[1], y), min(xs[0], x), max(xs[1], x)
            for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                if 0 <= ny < h and 0 <= nx < w and blocks[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        height, width = ys[1] - ys[0] + 1, xs[1] - xs[0] + 1
        if min(height, width) * cell >= min_side and area >= 0.8 * height * width:
            panels += 1
    return panels


def never_stopping(model: Captioner) -> Captioner:
    """A random model ends its captions at once or writes <pad>; this one writes words to the
    length limit (its output bias forbids <pad>, <bos> and <eos>)."""
    import torch

    vocab = model.vocab
    out = [m for m in model.decoder.modules() if isinstance(m, torch.nn.Linear) and m.out_features == len(vocab)][-1]
    with torch.no_grad():
        out.bias[[vocab.pad_id, vocab.bos_id, vocab.eos_id]] = -30.0
    return model


class LoopbackServer(ThreadingHTTPServer):
    """A test's HTTP server: a client that hangs up mid-reply (a run stopped on purpose, a download cut) is
    what the test does, not an error whose traceback belongs in the suite's log; other errors still print."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001 - socketserver's signature
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextmanager
def serving(handler: Callable[..., BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on 127.0.0.1 while the block runs; yields the base URL."""
    server = LoopbackServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextmanager
def fifo_with_a_writer(path: Path) -> Iterator[Path]:
    """A named pipe at `path` that a thread opens for writing and closes as soon as a reader opens it: code
    that reads it gets an empty file instead of waiting forever, so a test of a missing is-a-file check fails
    rather than hangs. Skipped where there are no named pipes."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes on this system")
    os.mkfifo(path)
    done = threading.Event()

    def write_once() -> None:
        while not done.is_set():
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # succeeds only while a reader has it open
                return
            except OSError:  # no reader yet
                done.wait(0.01)

    thread = threading.Thread(target=write_once, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        done.set()
        thread.join(5)


def render_results():
    """scripts/render_results.py as a module (the check a results record must pass), loaded once."""
    name = "render_results_for_tests"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "render_results.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclass looks its module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


@contextmanager
def held_elsewhere(kind: str, folder: Path, then: Callable[[], object]) -> Iterator[threading.Event]:
    """Another process's hold on `folder` for `kind` (`core.machine_cache.folder_held`), played by a thread with a
    lock of its own, as another process has one: it holds until the event it yields is set, then runs `then()` (what
    that process makes in the folder) and lets go."""
    from captioner.core.machine_cache import folder_held

    held, release = threading.Event(), threading.Event()

    def other() -> None:
        with folder_held(kind, folder, "holding it for a test", logging.getLogger(__name__)):
            held.set()
            release.wait(60)
            then()

    thread = threading.Thread(target=other)
    thread.start()
    held.wait(60)
    try:
        yield release
    finally:
        release.set()
        thread.join(60)


def released_once_said(caplog: pytest.LogCaptureFixture, said: str, release: threading.Event) -> threading.Thread:
    """A thread that sets `release` once a log record says `said` (or after a minute): the waiting process has
    said that it waits, so the holder may go on."""
    def watch() -> None:
        for _ in range(6000):
            if said in caplog.messages:
                break
            time.sleep(0.01)
        release.set()

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


RUN_HOLDER = """
import sys, time
from captioner.training.run_folders import hold_run_folder
try:
    hold_run_folder(sys.argv[1])
except Exception as e:
    print(e, flush=True)
    sys.exit(0)
print("held", flush=True)
time.sleep(600)
"""  # holds the run folder argv[1] as a training run does, printing "held", else its refusal


@contextmanager
def run_held_elsewhere(run: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """Another process holding the run folder `run` as a training run does (`hold_run_folder`) until the block
    ends; `env` its environment (default: `subprocess_env()`)."""
    process = subprocess.Popen([sys.executable, "-c", RUN_HOLDER, str(run)], stdout=subprocess.PIPE, text=True,
                               env=env or subprocess_env())
    try:
        assert process.stdout.readline() == "held\n"
        yield process
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


def exits_frozen(module: str) -> str:
    """`python -c` code that runs `module` as `python -m` would, then writes to standard error whether its objects
    were frozen as it exited (`gc.freeze()`, after which its atexit handlers run): "frozen 1" or "frozen 0". Standard
    error, since the demo's decoding child turns its standard output into a copy of it."""
    return ("import atexit, gc, os, runpy; "
            "atexit.register(lambda: os.write(2, b'frozen %d' % (gc.get_freeze_count() > 0))); "
            f"runpy.run_module({module!r}, run_name='__main__')")
