"""File checksums: what an export records at write time and verifies before anything reads it."""

from __future__ import annotations

import hashlib
from pathlib import Path

from captioner.core.errors import ExportError


def sha256_of(path: str | Path) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks (a model file never sits in memory twice)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


REEXPORT = "re-export the checkpoint"


def verify_file(path: Path, sha256: str, listed_in: Path, size: int | None = None, remedy: str = REEXPORT) -> None:
    """A missing, truncated or altered file `listed_in` records is one ExportError ending with `remedy`."""
    if not path.is_file():
        raise ExportError(f"{path}: missing (listed in {listed_in.name}); {remedy}")
    found = path.stat().st_size
    if size is not None and found != size:
        raise ExportError(
            f"{path}: {found} bytes, but {listed_in.name} records {size} (truncated or replaced); {remedy}"
        )
    if sha256_of(path) != sha256:
        raise ExportError(
            f"{path}: sha256 does not match {listed_in.name} (checksum differs: the file was changed or damaged); "
            f"{remedy}"
        )
