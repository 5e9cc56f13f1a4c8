"""A checkpoint file: its payload written with a checksum and read with weights_only (no code runs),
its format version, and the spec that rebuilds the model. The sha256 of everything before it sits in
the zip's end comment (its length field counted as zero), so a damaged checkpoint is refused by name."""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import time
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
# Files whose checksum held, by identity, size and modification time. Only a file last written well before its
# check is remembered (git's rule for racy files): a change after the check gets a later time than the
# remembered one, even where the file system keeps times to a few milliseconds.
_VERIFIED: set[tuple[int, int, int, int]] = set()
SETTLED_NS = 2_000_000_000

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


def verify_checksum(path: Path) -> bool:
    """Check `path`'s recorded checksum, once in a process for a file unchanged since (`_VERIFIED`): a command
    reads its checkpoint's run config, then its model. False when it records none (the caller warns, once it knows
    the file is a checkpoint of ours)."""
    stat = path.stat()
    if _identity(stat) in _VERIFIED:
        return True
    started, size = time.time_ns(), stat.st_size
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
            if started - stat.st_mtime_ns > SETTLED_NS:
                _VERIFIED.add(_identity(stat))
            return True
    if not tail[-END_RECORD_BYTES:].startswith(END_RECORD):  # every archive torch writes ends with it
        raise CheckpointError(f"{path}: not a readable captioner checkpoint (truncated, or another kind of file: "
                              f"{size} bytes that do not end as a torch archive does)")
    return False


def _identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def read_checkpoint(path: str | Path, *, for_inference: bool = False) -> dict[str, Any]:
    """A checkpoint's payload, read with weights_only (no code runs). `for_inference` leaves out the
    optimizer's state, never read from disk, and maps the weights from the file (mmap), read as the
    model copies them: a COCO checkpoint's Adam moments are two thirds of its size."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    checked = verify_checksum(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=for_inference)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable captioner checkpoint ({first_line(e)})") from None
    if not isinstance(payload, dict) or not {"model", "config", "vocab"} <= payload.keys():
        raise CheckpointError(f"{path}: not a captioner checkpoint (it lacks model, config or vocab)")
    version = payload.get("format_version")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise CheckpointError(f"{path}: checkpoint format {version!r} is not supported "
                              f"(this version reads {FORMAT_VERSION})")
    weights, config = payload["model"], payload["config"]
    if not (isinstance(weights, dict)
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items())):
        raise CheckpointError(f"{path}: not a captioner checkpoint (its model is not a mapping of names to tensors)")
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: not a captioner checkpoint (its config is a {type(config).__name__}, "
                              "not a mapping)")
    if not checked:  # said of a checkpoint this version reads: a refused file gets its one line, nothing else
        log.warning("%s: written without a checksum (before checksums were recorded): it cannot be checked for "
                    "damage", path)
    if for_inference:  # the weights stay mapped until copied; what a caller may keep is copied now
        payload = {key: _in_memory(value) if key != "model" else value
                   for key, value in payload.items() if key != "optimizer"}
    return {**payload, "config": upgrade.upgrade_run_config(payload["config"])}


def _in_memory(value: Any) -> Any:
    """`value` with its tensors copied off a mapped file: a caller may keep it after the file changes."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {key: _in_memory(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_in_memory(item) for item in value)
    return value


def checkpoint_spec(payload: dict[str, Any], path: str | Path) -> ModelSpec:
    """The model a payload describes: its `spec`, or in an older checkpoint its config's model sections."""
    try:
        return ModelSpec.from_dict(*upgrade.checkpoint_spec(payload, str(path)))
    except ConfigError as e:
        raise CheckpointError(f"{path}: incompatible config: {e}") from None
