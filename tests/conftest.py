"""Shared pytest fixtures, and the rule for tests that need something outside the repository.

Java (the official metrics), ../shared/data (real COCO and Flickr8k files) and Chromium (the
browser test) may be missing on a developer's machine: there the tests that need them skip. In
CI (CI=true) they FAIL instead, so a green CI means they really ran (see `helpers.require`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from helpers import require

CHROMIUM = Path("/usr/bin/chromium")


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
