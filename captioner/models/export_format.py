"""An exported model folder in the Hugging Face Hub layout (docs/export.md), written and read with
safetensors and JSON only: nothing is unpickled, so loading one can never run code."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import captioner
from captioner.core.bounded_files import own_file, read_format_json, read_json
from captioner.core.files import REEXPORT, make_folder, sha256_of as sha256, verify_file, write_atomically
from captioner.core.errors import CheckpointError, ConfigError, ExportError, first_line
from captioner.core.model_spec import ModelSpec, check_words
from captioner.core.portable_config import portable_config
from captioner.core.upgrade import OLDEST_EXPORT, upgrade_export_config

FORMAT = "captioner"
FORMAT_VERSION = 2  # of the folders `write_exported` writes: the model described by its `spec`
WEIGHTS, CONFIG, VOCAB, CARD = "model.safetensors", "config.json", "vocab.json", "README.md"


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


def verify_files(folder: Path, config: dict[str, Any], remedy: str = REEXPORT) -> None:
    """Check every file config.json lists for its recorded size and sha256."""
    files = config["files"]
    if not isinstance(files, dict) or not {WEIGHTS, VOCAB} <= files.keys():
        raise ExportError(f"{folder / CONFIG}: 'files' must list {WEIGHTS} and {VOCAB} with their checksums")
    for name, recorded in files.items():
        path = own_file(folder, name, f"{folder / CONFIG} (files)")  # before anything of it is read
        if not isinstance(recorded, dict) or "sha256" not in recorded:
            raise ExportError(f"{folder / CONFIG}: files.{name} has no sha256")
        verify_file(path, recorded["sha256"], folder / CONFIG, recorded.get("bytes"), remedy)


def read_exported(folder: str | Path, remedy: str | None = None) -> Exported:
    """An exported folder's config, vocabulary and weights, each checked; a failure ends with `remedy`."""
    folder = Path(folder)
    try:
        config = read_config(folder)
    except ExportError as e:
        raise ExportError(f"{e}; {remedy}" if remedy else str(e)) from None
    verify_files(folder, config, remedy or REEXPORT)
    try:
        return read_verified(folder, config)
    except ExportError as e:
        raise ExportError(f"{e}; {remedy}" if remedy else str(e)) from None


def read_verified(folder: Path, config: dict[str, Any]) -> Exported:
    """`read_exported`'s vocabulary and weights, once their checksums held."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

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
    try:
        state_dict = load_file(str(folder / WEIGHTS))
    except (SafetensorError, OSError, ValueError) as e:
        raise ExportError(f"{folder / WEIGHTS}: not a readable safetensors file ({first_line(e, 160)})") from None
    try:  # a refused setting: one CheckpointError naming config.json
        spec = ModelSpec.from_dict(config["spec"], f"{folder / CONFIG} (spec)", vocab)
    except ConfigError as e:
        raise CheckpointError(f"{folder / CONFIG}: incompatible config: {e}") from None
    return Exported(folder, spec, state_dict, config)
