"""A checkpoint file: its payload written with a checksum and read with weights_only (no code runs),
its format version, and the spec that rebuilds the model. The sha256 of everything before it sits in
the zip's end comment (its length field counted as zero), so a damaged checkpoint is refused by name."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import torch

from captioner.core.files import sha256_of, write_atomically
from captioner.core.errors import CheckpointError, ConfigError, first_line
from captioner.core.model_spec import ModelSpec
from captioner.core import upgrade

FORMAT_VERSION = 1  # of the files `checkpoint.save_checkpoint` writes (the `spec` in them has its own)
CHECKSUM_TAG = b"captioner-sha256:"
END_RECORD = b"PK\x05\x06"  # a zip's end of central directory: 22 bytes, then its comment
END_RECORD_BYTES = 22
COMMENT_BYTES = len(CHECKSUM_TAG) + 64  # the tag and a hex sha256

log = logging.getLogger(__name__)


class WriteErrorKeeper:
    """The file torch.save writes into, keeping the OSError of a failed write (torch's is a RuntimeError)."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def write_checkpoint_file(payload: dict[str, Any], path: str | Path) -> None:
    """torch.save `payload` to `path` atomically (a full disk leaves the old file), its sha256 in the comment."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            writer = WriteErrorKeeper(f)
            try:
                torch.save(payload, writer)
            except RuntimeError:
                if writer.error is not None:
                    raise writer.error from None
                raise
        # Hashed from the page cache just written: faster than hashing inside torch's write calls.
        comment = CHECKSUM_TAG + sha256_of(tmp).encode()
        # The archive ends with its end record, whose last two bytes are the comment's length (0).
        with open(tmp, "r+b") as f:
            f.seek(-2, os.SEEK_END)
            f.write(len(comment).to_bytes(2, "little") + comment)

    write_atomically(path, write)


def verify_checksum(path: Path) -> None:
    """Check `path`'s recorded checksum (a warning when it has none)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - END_RECORD_BYTES - COMMENT_BYTES))
        tail = f.read()
        if tail.startswith(END_RECORD) and tail[END_RECORD_BYTES:].startswith(CHECKSUM_TAG):
            recorded = tail[END_RECORD_BYTES + len(CHECKSUM_TAG):].decode("ascii", "replace")
            digest = hashlib.sha256()
            f.seek(0)
            remaining = size - COMMENT_BYTES - 2  # everything before the comment's length field
            while remaining > 0 and (block := f.read(min(1 << 20, remaining))):
                digest.update(block)
                remaining -= len(block)
            digest.update(b"\x00\x00")  # the length field as torch wrote it
            if digest.hexdigest() != recorded:
                raise CheckpointError(f"{path}: not a readable captioner checkpoint (its sha256 differs from the one "
                                      "recorded when it was written: the file is damaged or altered)")
            return
    if not tail[-END_RECORD_BYTES:].startswith(END_RECORD):  # every archive torch writes ends with it
        raise CheckpointError(f"{path}: not a readable captioner checkpoint (truncated, or another kind of file: "
                              f"{size} bytes that do not end as a torch archive does)")
    log.warning("%s: written without a checksum (before checksums were recorded): it cannot be checked for damage",
                path)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint's payload, read with weights_only (no code runs)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    verify_checksum(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable captioner checkpoint ({first_line(e)})") from None
    if not isinstance(payload, dict) or not {"model", "config", "vocab"} <= payload.keys():
        raise CheckpointError(f"{path}: not a captioner checkpoint (it lacks model, config or vocab)")
    version = payload.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {version} is not supported "
                              f"(this version reads {FORMAT_VERSION})")
    return {**payload, "config": upgrade.upgrade_run_config(payload["config"])}


def checkpoint_spec(payload: dict[str, Any], path: str | Path) -> ModelSpec:
    """The model a payload describes: its `spec`, or in an older checkpoint its config's model sections."""
    try:
        return ModelSpec.from_dict(*upgrade.checkpoint_spec(payload, str(path)))
    except ConfigError as e:
        raise CheckpointError(f"{path}: incompatible config: {e}") from None
