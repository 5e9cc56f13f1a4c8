"""`OnnxCaptioner`: caption images from an exported folder with onnxruntime, numpy and Pillow (docs/deploy.md).

The folder is checked first (`load_bundle`), every problem one `ExportError` line; images become the same
bytes as the PyTorch transform, and the search (`numpy_search.py`) calls the step graph once per word.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from PIL import Image

from captioner.core.bounded_files import own_file, read_format_json
from captioner.core.decode_results import Caption
from captioner.core.files import verify_file
from captioner.core.decode_schema import check_names, check_options
from captioner.core.errors import CaptionerError, ConfigError, ExportError
from captioner.core.model_spec import ONNX_FORMAT, ONNX_FORMAT_VERSION, ModelSpec, SpecialIds
from captioner.core.upgrade import OLDEST_ONNX, upgrade_onnx_manifest
from captioner.data.image_files import ImageInput, caption_in_batches
from captioner.deploy.numpy_search import Arrays, SearchOptions, TokenRules, decode_hypotheses
from captioner.text.vocab import Vocabulary, bad_ending_ids

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
    for candidate in (MANIFEST, f"onnx/{MANIFEST}"):
        if (folder / candidate).is_file():
            return own_file(folder, candidate, str(folder))
    if not folder.exists():
        raise ExportError(f"{folder}: no such folder")
    raise ExportError(
        f"{folder}: no {MANIFEST} here or in {folder / 'onnx'} (make one with `captioner export CKPT DIR --onnx`)")


def read_manifest(path: Path) -> dict[str, Any]:
    """onnx.json, read within its limits, checked for format, version and the fields the runtime reads."""
    manifest = read_format_json(path, f"model's {MANIFEST}", "captioner ONNX export", ONNX_FORMAT, ExportError)
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


def check_graph_shapes(manifest_path: Path, manifest: dict[str, Any], sessions: dict[str, ort.InferenceSession],
                       image_size: int, grid: tuple[int, int]) -> None:
    """The manifest's memory and state names, image size and grid as its graphs have them: an edited onnx.json
    is one line here, not an onnxruntime or numpy failure at the first caption."""
    memory = [f"memory.{k}" for k in manifest["memory"]]
    state = [f"state.{k}" for k in manifest["state"]]
    graphs = manifest["graphs"]
    if (not memory or graphs["decoder_init"]["outputs"] != memory + state
            or graphs["decoder_step"]["inputs"] != [*memory, "prev_tokens", *state]):
        raise ExportError(f"{manifest_path}: memory {str(manifest['memory'])[:80]} and state "
                          f"{str(manifest['state'])[:80]} are not the arrays its decoder graphs pass")
    size = sessions["encoder"].get_inputs()[0].shape[2:]  # [S, S], or names where the export left them free
    if any(isinstance(side, int) and side != image_size for side in size):
        raise ExportError(f"{manifest_path}: spec image_size {image_size}, but {manifest['files']['encoder']['path']} "
                          f"takes {size} images")
    places = sessions["decoder_step"].get_outputs()[1].shape[-1]  # attn (B, L, H, N): N = h * w
    if isinstance(places, int) and places != grid[0] * grid[1]:
        raise ExportError(f"{manifest_path}: spec grid {list(grid)}, but the step graph attends to {places} places")


def load_bundle(folder: str | Path, threads: int | None = None) -> Bundle:
    """An exported folder (holding onnx.json, or the one above it), checked, with its sessions on the CPU."""
    manifest_path = find_manifest(folder)
    manifest = read_manifest(manifest_path)
    try:
        spec = ModelSpec.from_dict(manifest["spec"], f"{manifest_path} (spec)", check_decoder=False)
    except ConfigError as e:
        raise ExportError(str(e)) from None
    if spec.grid is None:
        raise ExportError(f"{manifest_path}: spec.grid must be [h, w], got None")
    try:
        vocab = Vocabulary(list(spec.vocab))
    except CaptionerError as e:
        raise ExportError(f"{manifest_path}: spec.vocab: {e}") from None
    files = manifest["files"]
    graphs = {graph: own_file(Path(folder), manifest_path.parent.relative_to(folder) / files[graph]["path"],
                              str(manifest_path)) for graph in GRAPHS}  # in the folder named, links and all
    sessions = {graph: open_session(graphs[graph], manifest_path, files[graph]["sha256"], manifest["graphs"][graph],
                                    threads) for graph in GRAPHS}
    logprobs = sessions["decoder_step"].get_outputs()[0].shape  # ["batch", V]
    if logprobs[-1] != len(vocab):
        raise ExportError(f"{manifest_path}: the step graph scores {logprobs[-1]} words, its vocab has {len(vocab)}")
    check_graph_shapes(manifest_path, manifest, sessions, spec.preprocessing.image_size, spec.grid)
    return Bundle(manifest_path.parent, manifest, vocab, sessions, spec, spec.preprocessing.image_size, spec.grid,
                  spec.special, dataclasses.asdict(spec.decode))


def image_array(picture: Image.Image, size: int) -> np.ndarray:
    """An RGB picture -> uint8 (3, size, size): Pillow's bilinear resize, channels first."""
    resized = np.asarray(picture.resize((size, size), Image.BILINEAR))  # (S, S, 3)
    return np.ascontiguousarray(resized.transpose(2, 0, 1))  # (3, S, S)


OnnxCaption = Caption  # the runtime's captions: `Caption`, its maps numpy arrays


# The decoding options the exported search implements (core/decode_schema.py declares them all).
SEARCH_OPTIONS = tuple(f.name for f in dataclasses.fields(SearchOptions))


class OnnxCaptioner:
    """An exported captioner: its onnxruntime sessions, vocabulary and decoding defaults."""

    def __init__(self, bundle: Bundle) -> None:
        manifest = bundle.manifest
        self.bundle = bundle
        self.vocab = bundle.vocab
        self.image_size: int = bundle.image_size
        self.grid: tuple[int, int] = bundle.grid
        self.capacity: int | None = manifest["capacity"]
        self.decode_defaults: dict[str, Any] = dict(bundle.decode)
        self.memory_names = [f"memory.{k}" for k in manifest["memory"]]
        self.state_names = [f"state.{k}" for k in manifest["state"]]
        special = bundle.special
        ids = np.arange(len(self.vocab))  # (V,)
        banned = np.isin(ids, list(special.banned))  # (V,) bool
        bad_endings = np.isin(ids, list(bad_ending_ids(self.vocab.index)))  # (V,) bool
        self.rules = TokenRules(special.bos, special.eos, banned, bad_endings)

    @classmethod
    def from_folder(cls, folder: str | Path, threads: int | None = None) -> OnnxCaptioner:
        """The export in `folder` (holding onnx.json, or its parent), checked (`load_bundle`);
        `threads`: onnxruntime's threads per operator (default: the cores available)."""
        return cls(load_bundle(folder, threads))

    def options(self, **overrides: Any) -> SearchOptions:
        """The decoding defaults with `overrides` (None keeps a default), checked in one ConfigError line."""
        check_names(overrides, SEARCH_OPTIONS, " for the ONNX runtime")
        values = {name: self.decode_defaults[name] for name in SEARCH_OPTIONS}
        values = check_options(values | {name: value for name, value in overrides.items() if value is not None})
        if self.capacity is not None and values["max_length"] > self.capacity:
            raise ConfigError(f"decode: max_length {values['max_length']} exceeds the {self.capacity} steps "
                              f"{self.bundle.path('decoder_step')} was exported for (re-export with a larger capacity)")
        return SearchOptions(**values)

    def caption(
        self, images: ImageInput | Sequence[ImageInput], *, n_best: int | None = None, batch_size: int | None = None,
        errors: str = "raise", **options: Any,
    ) -> OnnxCaption | list[Any]:
        """As `Captioner.caption`: an image (path, bytes or PIL image) gives its caption, a list a list
        (with `n_best`, each image's n best); `options`: the `SEARCH_OPTIONS` (None: the export's).
        `errors="return"` puts an unreadable image's error in its place."""
        search = self.options(**options)
        if n_best is not None:
            check_options({"n_best": n_best, "beam_size": search.beam_size})
        return caption_in_batches(
            images, batch_size or self.decode_defaults["batch_size"],
            lambda pictures: self.caption_arrays(np.stack([image_array(p, self.image_size) for p in pictures]),
                                                 search, n_best),  # (B, 3, S, S)
            n_best=n_best, errors=errors,
        )

    def caption_arrays(self, images: np.ndarray, search: SearchOptions | None = None,
                       n_best: int | None = None) -> list:
        """uint8 images (B, 3, S, S) -> a caption each, or with `n_best` each image's n best, best first."""
        feats = self.encode(images)  # (B, N, D)
        memory, state = self.start(feats)
        ranked = decode_hypotheses(self.step, memory, state, self.rules, search or self.options(), n_best or 1)
        captions = [[h.caption(self.vocab.decode_words(h.tokens), self.grid) for h in hyps] for hyps in ranked]
        return captions if n_best is not None else [best[0] for best in captions]

    def encode(self, images: np.ndarray) -> np.ndarray:
        """uint8 images (B, 3, S, S) -> feats (B, N, D)."""
        return self.run("encoder", ["feats"], {"images": images})[0]  # (B, N, D)

    def start(self, feats: np.ndarray) -> tuple[Arrays, Arrays]:
        """feats (B, N, D) -> the decoder's memory and first state, by name."""
        outputs = self.run("decoder_init", None, {"feats": feats})
        n = len(self.memory_names)
        return dict(zip(self.memory_names, outputs[:n])), dict(zip(self.state_names, outputs[n:]))

    def step(self, memory: Arrays, prev: np.ndarray, state: Arrays) -> tuple[np.ndarray, np.ndarray, Arrays]:
        """One decoder step: prev (R,) -> logprobs (R, V), attn (R, L, H, N), the next state."""
        outputs = self.run("decoder_step", None, {**memory, "prev_tokens": prev, **state})
        return outputs[0], outputs[1], dict(zip(self.state_names, outputs[2:]))

    def run(self, graph: str, outputs: list[str] | None, feeds: Arrays) -> list[np.ndarray]:
        """One graph run; a failure inside onnxruntime (graphs that do not fit one another: an edited export) is
        one ExportError line naming the graph's file, not onnxruntime's traceback at the first caption."""
        try:
            return self.bundle.sessions[graph].run(outputs, feeds)
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own several classes
            raise ExportError(f"{self.bundle.path(graph)}: onnxruntime failed running it "
                              f"({' '.join(str(e).split())[:200]}); re-export the checkpoint") from None
