"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only real-data folder (COCO captions, Flickr8k): $CAPTIONER_SHARED_DATA, else
    shared/data beside the repository. Tests that need it are skipped when it is absent."""
    default = Path(__file__).resolve().parents[2] / "shared" / "data"
    path = Path(os.environ.get("CAPTIONER_SHARED_DATA", default))
    if not path.is_dir():
        pytest.skip(f"shared data folder not found: {path} (set CAPTIONER_SHARED_DATA)")
    return path
