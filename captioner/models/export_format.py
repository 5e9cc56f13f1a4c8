"""An exported model folder in the Hugging Face Hub layout (docs/export.md), written and read with
safetensors and JSON only: nothing is unpickled, so loading one can never run code."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import captioner
from captioner.core.bounded_files import CARD_BYTES, MODEL_JSON_BYTES, own_file, parse_json, read_format_json, read_json
from captioner.core.files import REEXPORT, make_folder, sha256_of as sha256, size_text, verify_file, write_atomically
from captioner.core.errors import CheckpointError, ConfigError, ExportError, first_line
from captioner.core.model_spec import ModelSpec, check_words
from captioner.core.portable_config import portable_config
from captioner.core.upgrade import OLDEST_EXPORT, upgrade_export_config

FORMAT = "captioner"
FORMAT_VERSION = 2  # of the folders `write_exported` writes: the model described by its `spec`
WEIGHTS, CONFIG, VOCAB, CARD = "model.safetensors", "config.json", "vocab.json", "README.md"
# The files config.json lists that loading a model or showing its card reads, and the most bytes each is read within
# (the weights are sized by their header).
READ_CAPS = {WEIGHTS: None, VOCAB: MODEL_JSON_BYTES, CARD: CARD_BYTES}
# Bytes a value of each safetensors dtype takes, for the dtypes safetensors' torch loader reads.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E4M3FNUZ": 1, "F8_E5M2": 1, "F8_E5M2FNUZ": 1, "C64": 8, "U64": 8, "U32": 4, "U16": 2}
# What sizes an export's weights against its model before they are hashed: (spec, config.json, weights held).
SizeCheck = Callable[[ModelSpec, dict[str, Any], int], None]


@dataclass
class Exported:
    """What an exported folder holds, checked."""

    folder: Path
    spec: ModelSpec  # the vocabulary included
    state_dict: dict[str, torch.Tensor]
    config: dict[str, Any]  # the whole config.json


def is_exported(path: str | Path) -> bool:
    """A folder with a config.json: an exported model (a run folder has best.pt or last.pt)."""
    return (Path(path) / CONFIG).is_file()


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """safetensors' save_file, a full disk raised as its OSError, the file as readable as the umask allows."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as e:
        found = re.search(r"I/O error: (.*) \(os error (\d+)\)", str(e))
        if found is None:
            raise
        raise OSError(int(found[2]), found[1]) from None
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def write_exported(
    folder: str | Path, state_dict: dict[str, torch.Tensor], spec: ModelSpec, metadata_fields: dict[str, Any],
    checksummed: Sequence[str] = (),
) -> list[Path]:
    """Write model.safetensors, vocab.json and, last, config.json (`metadata_fields`, checksums) into `folder`."""
    folder = Path(folder)
    make_folder(folder, str(folder))  # a file where a folder of the path goes, say: one line, the user's to fix
    # Copies, contiguous and unshared: safetensors refuses tensors that share storage (tied weights).
    tensors = {name: value.detach().to("cpu").contiguous().clone() for name, value in state_dict.items()}
    write_atomically(folder / WEIGHTS, lambda tmp: save_safetensors(tensors, tmp))
    words = json.dumps(list(spec.vocab), ensure_ascii=False)
    write_atomically(folder / VOCAB, lambda tmp: tmp.write_text(words, encoding="utf-8"))
    if isinstance(metadata_fields.get("training_config"), dict):
        metadata_fields = {**metadata_fields, "training_config": portable_config(metadata_fields["training_config"])}
    config = {
        "library_name": FORMAT, "format": FORMAT, "format_version": FORMAT_VERSION,
        "captioner_version": captioner.__version__, "spec": spec.to_dict(with_vocab=False),
        **metadata_fields,
        "files": {
            name: {"sha256": sha256(folder / name), "bytes": (folder / name).stat().st_size}
            for name in dict.fromkeys((WEIGHTS, VOCAB, *checksummed))
        },
    }
    write_atomically(folder / CONFIG, lambda tmp: tmp.write_text(json.dumps(config, indent=1), encoding="utf-8"))
    return [folder / WEIGHTS, folder / VOCAB, folder / CONFIG]


def read_config(folder: str | Path) -> dict[str, Any]:
    """config.json of an exported folder, read within limits, its format and version checked."""
    path = own_file(Path(folder), CONFIG, str(folder))
    config = read_format_json(path, f"model's {CONFIG}", "captioner export", FORMAT, ExportError,
                              missing=f"missing (an exported model folder has {CONFIG}, {VOCAB} and {WEIGHTS})")
    version = config.get("format_version")
    if version not in range(OLDEST_EXPORT, FORMAT_VERSION + 1) or isinstance(version, bool):
        raise ExportError(f"{path}: export format version {version!r} is not supported (this version, "
                          f"captioner {captioner.__version__}, reads {OLDEST_EXPORT} and {FORMAT_VERSION})")
    try:
        config = upgrade_export_config(config, str(path))
    except ConfigError as e:
        raise CheckpointError(f"{path}: incompatible config: {e}") from None
    for key in ("spec", "files"):
        if key not in config:
            raise ExportError(f"{path}: lacks {key!r}")
    return config


def verify_files(folder: Path, config: dict[str, Any], remedy: str = REEXPORT, deferred: Collection[str] = ()) -> None:
    """Check every file config.json lists for its recorded size, and those a model's loading reads for their sha256
    too: a file read within a cap is sized against it first, and the weights (`deferred`) are left to the caller,
    who sizes them against what they must hold. A file loading never reads is never read here either: a stranger's
    listed terabyte costs a stat, not a terabyte hashed."""
    files = config["files"]
    if not isinstance(files, dict) or not {WEIGHTS, VOCAB} <= files.keys():
        raise ExportError(f"{folder / CONFIG}: 'files' must list {WEIGHTS} and {VOCAB} with their checksums")
    for name, recorded in files.items():
        path = own_file(folder, name, f"{folder / CONFIG} (files)")  # before anything of it is read
        if not isinstance(recorded, dict) or "sha256" not in recorded:
            raise ExportError(f"{folder / CONFIG}: files.{name} has no sha256")
        cap = READ_CAPS.get(name)
        if cap is not None and path.is_file() and path.stat().st_size > cap:
            raise ExportError(f"{path}: {size_text(path.stat().st_size)}, more than the {size_text(cap)} a model's "
                              f"{name} may take; refused before reading it")
        read = name in READ_CAPS and name not in deferred
        verify_file(path, recorded["sha256"], folder / CONFIG, recorded.get("bytes"), remedy, read)


@contextlib.contextmanager
def remedied(remedy: str | None) -> Iterator[None]:
    """An ExportError raised inside, ending with `remedy` when there is one."""
    try:
        yield
    except ExportError as e:
        raise ExportError(f"{e}; {remedy}" if remedy else str(e)) from None


def read_exported(folder: str | Path, remedy: str | None = None, size_check: SizeCheck | None = None) -> Exported:
    """An exported folder's config, vocabulary and weights, each checked; a failure ends with `remedy`. The weights
    are sized by their header, and by `size_check` against the model config.json describes, before they are hashed:
    a stranger's sparse file of a terabyte is one line, not a terabyte read."""
    folder = Path(folder)
    with remedied(remedy):
        config = read_config(folder)
    verify_files(folder, config, remedy or REEXPORT, deferred={WEIGHTS})
    with remedied(remedy):
        spec = read_spec(folder, config)
        held = weights_held(folder / WEIGHTS)
    if size_check is not None:  # its own lines, as they were once the weights were read
        size_check(spec, config, held)
    verify_file(folder / WEIGHTS, config["files"][WEIGHTS]["sha256"], folder / CONFIG, remedy=remedy or REEXPORT)
    with remedied(remedy):
        return Exported(folder, spec, read_weights(folder / WEIGHTS), config)


def read_spec(folder: Path, config: dict[str, Any]) -> ModelSpec:
    """The spec of `read_exported`'s folder, its vocabulary read from vocab.json once its checksum held."""
    try:
        vocab = read_json(folder / VOCAB, f"model's {VOCAB}", ExportError)
    except FileNotFoundError:  # gone since its checksum was verified
        raise ExportError(f"{folder / VOCAB}: missing") from None
    if not isinstance(vocab, list) or not all(isinstance(w, str) for w in vocab):
        raise ExportError(f"{folder / VOCAB}: expected a list of words")
    try:
        check_words(vocab, str(folder / VOCAB))
    except ConfigError as e:
        raise ExportError(str(e)) from None
    size = config["spec"].get("vocab_size") if isinstance(config["spec"], dict) else None
    if len(vocab) != size:
        raise ExportError(f"{folder / VOCAB}: {len(vocab)} words, but {CONFIG} says vocab_size {size!r}")
    try:  # a refused setting: one CheckpointError naming config.json
        return ModelSpec.from_dict(config["spec"], f"{folder / CONFIG} (spec)", vocab)
    except ConfigError as e:
        raise CheckpointError(f"{folder / CONFIG}: incompatible config: {e}") from None


def safetensors_header(path: Path) -> tuple[Any, int, int]:
    """The JSON header of safetensors file `path` (an 8-byte length, then the JSON), read within MODEL_JSON_BYTES,
    with the byte its data starts at and the file's size; a header past the file's end is one ExportError."""
    unreadable = f"{path}: not a readable safetensors file"
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            length = int.from_bytes(head, "little")
            if len(head) < 8:
                raise ExportError(f"{unreadable} ({size} bytes, fewer than the 8 of its header's length)")
            if length > MODEL_JSON_BYTES:
                raise ExportError(f"{unreadable} (a header of {size_text(length)}, more than the "
                                  f"{size_text(MODEL_JSON_BYTES)} one may take); refused before reading it")
            if 8 + length > size:
                raise ExportError(f"{unreadable} (a header of {length:,} bytes in a file of {size:,})")
            data = f.read(length)
    except FileNotFoundError:  # gone since its size was checked
        raise ExportError(f"{path}: missing") from None
    except OSError as e:
        raise ExportError(f"{path}: cannot be read ({e.strerror or e})") from None
    return parse_json(data, f"{path} (header)", "safetensors header", ExportError), 8 + length, size


def weights_held(path: Path) -> int:
    """How many weights safetensors file `path` holds, by its header alone: each tensor's dtype, shape and offsets
    must agree, and together tile the data to the file's last byte (as safetensors checks when it loads), so
    that the file is no larger than its weights; else one ExportError naming the file and the sizes."""
    header, start, size = safetensors_header(path)
    if not isinstance(header, dict):
        raise ExportError(f"{path}: not a readable safetensors file (its header is not a JSON object)")
    held, spans = 0, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        fields = entry if isinstance(entry, dict) else {}
        dtype, shape, offsets = fields.get("dtype"), fields.get("shape"), fields.get("data_offsets")
        readable = isinstance(dtype, str) and dtype in DTYPE_BYTES and whole_numbers(shape)
        if not readable or not whole_numbers(offsets) or len(offsets) != 2:
            raise ExportError(f"{path}: not a readable safetensors file (tensor {name!r}: its dtype, shape or "
                              "data_offsets are not ones safetensors reads)")
        count = math.prod(shape)
        if offsets[1] - offsets[0] != count * DTYPE_BYTES[dtype]:
            raise ExportError(f"{path}: not a readable safetensors file (tensor {name!r}: {count:,} {dtype} values "
                              f"in {offsets[1] - offsets[0]:,} bytes)")
        held += count
        spans.append(offsets)
    end = 0
    for begin, stop in sorted(spans):
        if begin != end:
            raise ExportError(f"{path}: not a readable safetensors file (its tensors' data leave a gap or overlap "
                              f"at byte {start + begin:,})")
        end = stop
    if start + end != size:
        raise ExportError(f"{path}: {size:,} bytes, but its header's tensors end at byte {start + end:,}; refused "
                          "before reading it")
    return held


def whole_numbers(value: Any) -> bool:
    """Whether `value` is a list of whole numbers, none negative (a JSON shape or pair of offsets)."""
    return isinstance(value, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value)


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """safetensors file `path`'s tensors, once its size and checksum held; one ExportError if it will not load."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ExportError(f"{path}: not a readable safetensors file ({first_line(e, 160)})") from None
