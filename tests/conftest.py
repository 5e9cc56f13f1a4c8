"""Shared pytest fixtures, and the rule for tests that need something outside the repository.

Java (the official metrics), ../shared/data (real COCO and Flickr8k files) and Chromium (the
browser test) may be missing on a developer's machine: there the tests that need them skip. In
CI (CI=true) they FAIL instead, so a green CI means they really ran (see `helpers.require`).
"""

from __future__ import annotations

import functools
import gc
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from helpers import require, shared_folder, subprocess_env
import rewrite_share
import suite_timeline
import warm_start

# What the library measures about the machine (core/machine_cache.py) goes to a folder of the
# test session's, not the user's ~/.cache; child processes inherit it, so they share one decision.
# One torch thread per test process: run_tests.sh runs one pytest worker per core, and a fixed
# count keeps a test's training run from changing threads midway (core.process_settings.ThreadGovernor),
# so runs that must agree to the bit (resume, DDP against one process) sum in one order.
os.environ.setdefault("CAPTIONER_THREADS", "1")
# The controller (or the only process) makes it and removes it at the end: it holds METEOR's
# uncompressed paraphrase table and index (evaluation/meteor.py), about 390 MB.
_MADE_CACHE = "CAPTIONER_CACHE_DIR" not in os.environ
if _MADE_CACHE:
    os.environ["CAPTIONER_CACHE_DIR"] = __import__("tempfile").mkdtemp(prefix="captioner-test-cache-")


_BESIDE_THE_WORKERS: list = []  # the controller's threads of work for the workers (test_install_roles' resolutions)


def pytest_sessionstart(session: pytest.Session) -> None:
    """pytest-xdist's controller waits while its workers run: where the install roles' module is to be collected, it
    resolves them meanwhile (test_install_roles.resolve_beside_the_workers), in the run's folder the workers share."""
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    if Path(__file__).with_name("test_install_roles.py") in rewrite_share.collected_modules(config.args):
        import test_install_roles

        thread = test_install_roles.resolve_beside_the_workers(config._tmp_path_factory.getbasetemp())
        _BESIDE_THE_WORKERS.extend([thread] if thread else [])


def pytest_unconfigure(config: pytest.Config) -> None:
    for thread in _BESIDE_THE_WORKERS:  # a run that ended early: its resolvers end before the run's folder goes
        thread.join(timeout=120)
    # The session's objects into the collector's permanent generation: the exit that follows then does not
    # collect them again (3 s of a worker's, the controller waits on it; tests/suite_timeline.py's tail).
    gc.freeze()
    if _MADE_CACHE and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["CAPTIONER_CACHE_DIR"], ignore_errors=True)

# Where the suite's time goes, printed after every run (tests/suite_timeline.py): its hooks, here.
pytest_configure = suite_timeline.pytest_configure
pytest_runtest_protocol = suite_timeline.pytest_runtest_protocol
pytest_terminal_summary = suite_timeline.pytest_terminal_summary
# Each worker rewrites the asserts of its share of the modules for all (tests/rewrite_share.py).
pytest_collection = rewrite_share.pytest_collection

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def in_an_empty_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts in an empty folder of its own, wherever pytest was started: a test that
    found the project's files through the working folder (configs/..., tests.helpers) passed only
    from the checkout's root, and one that wrote runs/ or data/ there wrote into the checkout."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(autouse=True)
def products_route_kept() -> Iterator[None]:
    """A run resumed in the test's own process takes the products route its last.pt records
    (`products.take_route`) for the whole process: put back after the test, so that a later one on this worker
    meets the machine's route, whichever ran first."""
    from captioner.models import products

    saved = {name: getattr(products, name) for name in ("_ENABLED", "_CHECKED", "_GRAM_MM", "_GRAD_MM")}
    yield
    for name, value in saved.items():
        setattr(products, name, value)


@pytest.fixture(autouse=True, scope="session")
def warm_decoding_children() -> Iterator[None]:
    """The demo's decoding processes fork from the pytest worker's warm interpreter (tests/warm_start.py), as the
    CLI's children do: 3 CPU s less each. tests/test_demo_decoding.py's shared decoder starts one cold."""
    from captioner.apps.demo import decoding

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decoding, "child_process", functools.partial(decoding.child_process, popen=warm_popen))
        yield


def warm_popen(command: list[str], **options) -> warm_start.Popen:
    """warm_start.Popen in the warm interpreter's environment (helpers.subprocess_env), the child's PYTHONPATH
    kept: forked, not cold."""
    return warm_start.Popen(command, **{**options, "env": subprocess_env(PYTHONPATH=options["env"]["PYTHONPATH"])})


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only real-data folder (COCO captions, Flickr8k): $CAPTIONER_SHARED_DATA, else
    shared/data beside the repository."""
    default = Path(__file__).resolve().parents[2] / "shared" / "data"
    path = Path(os.environ.get("CAPTIONER_SHARED_DATA", default))
    require(path.is_dir(), f"shared data folder not found: {path} (set CAPTIONER_SHARED_DATA)")
    return path


@pytest.fixture(scope="session")
def java() -> str:
    """The `java` executable: pycocoevalcap's PTB tokenizer, METEOR and SPICE run on it."""
    path = shutil.which("java")
    require(path is not None, "the official metrics need Java on PATH")
    return str(path)


@pytest.fixture(scope="session")
def chromium() -> Path:
    """The system Chromium that playwright drives (no browser download in CI)."""
    require(CHROMIUM.exists(), f"{CHROMIUM} not found (apt-get install chromium)")
    return CHROMIUM


@dataclass
class TrainedRun:
    """A tiny Show-Attend-Tell LSTM trained once per test session on a small shapes world,
    through the CLI, and shared by the end-to-end and demo tests (CI trains it once)."""

    root: Path  # a session temporary folder
    shapes: Path  # the generated world: train/ val/ test/, captions_*.json, instances_*.json
    run: Path  # train.out_dir: best.pt, last.pt, metrics.csv, ...
    train_args: list[str]  # the `captioner train` command line that made it

    @property
    def checkpoint(self) -> Path:
        return self.run / "best.pt"

    @property
    def test_images(self) -> list[Path]:
        return sorted((self.shapes / "test").iterdir())


SHAPES_TINY = [
    "data.shapes_num_train=300",
    "data.shapes_num_val=24",
    "data.shapes_num_test=12",
    "data.image_size=64",
    "data.batch_size=16",
    "model.encoder.width=16",
    "model.decoder.embed_dim=32",
    "model.decoder.hidden_dim=64",
    "model.decoder.attention_dim=32",
    "model.decoder.dropout=0.0",
    "train.epochs=8",
    "train.lr=3e-3",
    "train.warmup_steps=5",
    "train.early_stopping_patience=0",
    "decode.max_length=20",
    "train.cpu_amp=fp32",  # auto would time bf16 against fp32 on a processor with both: a coin flip of weights
]


@pytest.fixture(scope="session")
def shapes_lstm(tmp_path_factory: pytest.TempPathFactory) -> TrainedRun:
    """Seconds on one core: generate 300 + 24 + 12 shapes images and train 8 epochs, once per test
    run: the first pytest worker to need it trains it, under a lock, and the others read it (the
    tests copy the run before changing anything in it)."""
    from filelock import FileLock

    from captioner.apps.cli import main

    root = shared_folder(tmp_path_factory) / "shapes_lstm"
    args = ["train", str(REPO / "configs/shapes_lstm.yaml"), *SHAPES_TINY, f"data.root={root / 'shapes'}",
            f"train.out_dir={root / 'run'}"]
    with FileLock(f"{root}.lock"):
        if not (root / "trained").is_file():
            shutil.rmtree(root, ignore_errors=True)  # an earlier worker's attempt that failed
            root.mkdir()
            torch.set_num_threads(1)
            assert main(args) == 0
            (root / "trained").touch()
    return TrainedRun(root, root / "shapes", root / "run", args)


@pytest.fixture(scope="module")
def shapes_model(shapes_lstm: TrainedRun):
    """The session's tiny trained LSTM, loaded for one module, on one torch thread."""
    from captioner.models.checkpoint import load_captioner

    torch.set_num_threads(1)
    return load_captioner(shapes_lstm.checkpoint)


@pytest.fixture(scope="module")
def shapes_pictures(shapes_lstm: TrainedRun) -> list:
    """Its test images, loaded as the CLI loads a file: each captioned differently by it."""
    from captioner.data.image_files import load_image

    return [load_image(path) for path in shapes_lstm.test_images]
