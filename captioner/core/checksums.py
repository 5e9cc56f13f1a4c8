"""File checksums: what an export records at write time and verifies before anything reads it."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_of(path: str | Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks (a model file never sits in memory twice)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
