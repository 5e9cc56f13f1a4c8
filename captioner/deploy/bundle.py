"""An exported folder, checked: `onnx.json` read and validated (an older one through core/upgrade.py),
every graph's checksum compared, and the onnxruntime sessions made. The format is declared in
core/model_spec.py (models and deploy may not import each other). Every problem is one `ExportError` line.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnxruntime as ort

from captioner.core.bounded_files import read_json
from captioner.core.checksums import verify_file
from captioner.core.errors import CaptionerError, ConfigError, ExportError
from captioner.core.model_spec import ONNX_FORMAT, ONNX_FORMAT_VERSION, ModelSpec, SpecialIds
from captioner.core.upgrade import OLDEST_ONNX, upgrade_onnx_manifest
from captioner.text.vocab import Vocabulary

MANIFEST = "onnx.json"
GRAPHS = ("encoder", "decoder_init", "decoder_step")

# The fields the runtime reads, with the JSON types each must have.
GRAPH_FIELDS: dict[str, type | tuple[type, ...]] = {
    "files": dict, "graphs": dict, "memory": list, "state": list, "capacity": (int, type(None)), "spec": dict,
}


@dataclass
class Bundle:
    """A checked export: its manifest, the model it holds and one session per graph."""

    folder: Path  # the folder holding onnx.json
    manifest: dict[str, Any]
    vocab: Vocabulary
    sessions: dict[str, ort.InferenceSession]
    spec: ModelSpec
    image_size: int
    grid: tuple[int, int]  # (h, w) of the encoder's feature grid
    special: SpecialIds
    decode: dict[str, Any]  # the model's decoding defaults (its config's decode section)

    def path(self, graph: str) -> Path:
        return self.folder / self.manifest["files"][graph]["path"]


def find_manifest(folder: str | Path) -> Path:
    """`folder`/onnx.json, or `folder`/onnx/onnx.json (the folder `captioner export` was given)."""
    folder = Path(folder)
    for candidate in (folder / MANIFEST, folder / "onnx" / MANIFEST):
        if candidate.is_file():
            return candidate
    if not folder.exists():
        raise ExportError(f"{folder}: no such folder")
    raise ExportError(
        f"{folder}: no {MANIFEST} here or in {folder / 'onnx'} (make one with `captioner export CKPT DIR --onnx`)")


def read_manifest(path: Path) -> dict[str, Any]:
    """onnx.json, read within its limits, checked for format, version and the fields the runtime reads."""
    try:
        manifest = read_json(path, f"model's {MANIFEST}", ExportError)
    except FileNotFoundError:
        raise ExportError(f"{path}: missing") from None
    if not isinstance(manifest, dict) or manifest.get("format") != ONNX_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ExportError(f"{path}: not a captioner ONNX export (format {found!r}, expected {ONNX_FORMAT!r})")
    version = manifest.get("format_version")
    if version not in range(OLDEST_ONNX, ONNX_FORMAT_VERSION + 1) or isinstance(version, bool):
        raise ExportError(
            f"{path}: format_version {version!r} is another captioner version's ONNX format (this one reads "
            f"{OLDEST_ONNX} and {ONNX_FORMAT_VERSION}; exported by captioner "
            f"{manifest.get('captioner_version', '?')}): re-export the checkpoint"
        )
    manifest = upgrade_onnx_manifest(manifest, str(path))
    for field, kind in GRAPH_FIELDS.items():
        if not isinstance(manifest.get(field), kind) or isinstance(manifest.get(field), bool):
            raise ExportError(f"{path}: field {field!r} is missing or malformed")
    for graph in GRAPHS:
        entry, names = manifest["files"].get(graph), manifest["graphs"].get(graph)
        if not (isinstance(entry, dict) and isinstance(entry.get("path"), str)
                and isinstance(entry.get("sha256"), str)):
            raise ExportError(f"{path}: files.{graph} must give the graph's path and sha256")
        if Path(entry["path"]).name != entry["path"] or entry["path"] in ("", ".", ".."):
            raise ExportError(f"{path}: files.{graph}.path must be a file name beside onnx.json, got {entry['path']!r}")
        if not (isinstance(names, dict) and all(isinstance(names.get(k), list) for k in ("inputs", "outputs"))):
            raise ExportError(f"{path}: graphs.{graph} must list the graph's inputs and outputs")
    return manifest


def read_model(manifest: dict[str, Any], path: Path) -> tuple[ModelSpec, Vocabulary]:
    """The model's spec and vocabulary; one ExportError naming `path` when they do not hold."""
    try:
        spec = ModelSpec.from_dict(manifest["spec"], f"{path} (spec)", check_decoder=False)
    except ConfigError as e:
        raise ExportError(str(e)) from None
    if spec.grid is None:
        raise ExportError(f"{path}: spec.grid must be [h, w], got None")
    try:
        vocab = Vocabulary(list(spec.vocab))
    except CaptionerError as e:
        raise ExportError(f"{path}: spec.vocab: {e}") from None
    return spec, vocab


def session_options(threads: int | None) -> ort.SessionOptions:
    """One graph at a time: `threads` (default: the cores this process may use) per operator, none
    between. Idle threads sleep, not spin: a decode runs many small operators, and on a shared CPU
    spinning threads take the working ones' cycles (on 2 busy cores, batch-1 latency fell fourfold)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only: the CLI's output is the captions
    return options


def open_session(path: Path, manifest_path: Path, expected_sha256: str, names: dict,
                 threads: int | None) -> ort.InferenceSession:
    """The checked graph file's session, its inputs and outputs those onnx.json names."""
    verify_file(path, expected_sha256, manifest_path)
    try:
        session = ort.InferenceSession(str(path), sess_options=session_options(threads),
                                       providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own several classes for a bad model
        raise ExportError(f"{path}: onnxruntime cannot load it ({' '.join(str(e).split())[:200]})") from None
    inputs, outputs = [i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()]
    if inputs != names["inputs"] or outputs != names["outputs"]:
        raise ExportError(f"{path}: inputs {inputs} and outputs {outputs} are not those {manifest_path.name} lists")
    return session


def load_bundle(folder: str | Path, threads: int | None = None) -> Bundle:
    """An exported folder (holding onnx.json, or the one above it), checked, with its sessions on the CPU."""
    manifest_path = find_manifest(folder)
    manifest = read_manifest(manifest_path)
    spec, vocab = read_model(manifest, manifest_path)
    files = manifest["files"]
    sessions = {graph: open_session(manifest_path.parent / files[graph]["path"], manifest_path, files[graph]["sha256"],
                                    manifest["graphs"][graph], threads) for graph in GRAPHS}
    logprobs = sessions["decoder_step"].get_outputs()[0].shape  # ["batch", V]
    if logprobs[-1] != len(vocab):
        raise ExportError(f"{manifest_path}: the step graph scores {logprobs[-1]} words, its vocab has {len(vocab)}")
    return Bundle(manifest_path.parent, manifest, vocab, sessions, spec, spec.preprocessing.image_size, spec.grid,
                  spec.special, dataclasses.asdict(spec.decode))
