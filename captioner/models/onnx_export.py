"""ONNX export: a Captioner -> encoder.onnx, decoder_init.onnx (`prepare` + `init_state`), decoder_step.onnx
(`step`) and an `onnx.json` that `captioner.deploy` runs with onnxruntime, numpy and Pillow alone (docs/deploy.md);
the export fails unless onnxruntime reproduces torch."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import io
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import captioner
from captioner.core.files import sha256_of, write_atomically
from captioner.core.errors import ExportError
from captioner.core.model_spec import ONNX_FORMAT, ONNX_FORMAT_VERSION
from captioner.models.captioner import Captioner
from captioner.models.decoder import Decoder

DEFAULT_OPSET = 17
DYNAMO_MIN_OPSET = 18  # the dynamo exporter writes opset 18 and later
SUBFOLDER = "onnx"
MANIFEST = "onnx.json"
GRAPH_FILES = {key: f"{key}.onnx" for key in ("encoder", "decoder_init", "decoder_step")}
PARITY_TOLERANCE = 1e-4  # max |onnxruntime - torch| allowed, relative to the tensor's scale (at least 1)
# What the exporters record about the tracing in a graph's metadata: source lines, module paths.
TRACE_KEYS = ("pkg.torch.onnx.", "namespace")


class EncoderGraph(nn.Module):
    """uint8 images (B, 3, S, S) -> feats (B, N, D), as `Captioner.encode` (zeros for a blind model)."""

    def __init__(self, model: Captioner) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.encode(images)[0]  # (B, N, D)


class DecoderInitGraph(nn.Module):
    """feats (B, N, D) -> the memory tensors, then the state tensors, in the given key orders."""

    def __init__(self, decoder: Decoder, memory_keys: list[str], state_keys: list[str], capacity: int | None) -> None:
        super().__init__()
        self.decoder, self.memory_keys, self.state_keys, self.capacity = decoder, memory_keys, state_keys, capacity

    def forward(self, feats: torch.Tensor) -> tuple[torch.Tensor, ...]:
        memory = self.decoder.prepare(feats)
        state = self.decoder.init_state(memory, capacity=self.capacity)
        return (*[memory[k] for k in self.memory_keys], *[state[k] for k in self.state_keys])


class DecoderStepGraph(nn.Module):
    """`Decoder.step` with flat tensors: memory..., prev_tokens, state... -> logprobs, attn, state..."""

    def __init__(self, decoder: Decoder, memory_keys: list[str], state_keys: list[str]) -> None:
        super().__init__()
        self.decoder, self.memory_keys, self.state_keys = decoder, memory_keys, state_keys

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = len(self.memory_keys)
        memory = dict(zip(self.memory_keys, tensors[:n]))
        state = dict(zip(self.state_keys, tensors[n + 1 :]))
        logprobs, attn, state = self.decoder.step(memory, tensors[n], state)  # (B, V), (B, L, H, N)
        return (logprobs, attn, *[state[k] for k in self.state_keys])


@dataclasses.dataclass(frozen=True)
class GraphSpec:
    """One graph to write: the module, example inputs, and its input and output names."""

    key: str
    module: nn.Module
    example: tuple[torch.Tensor, ...]
    inputs: list[str]
    outputs: list[str]

    def __post_init__(self) -> None:
        # In eval mode from the start: the exporter restores the wrapper's mode recursively after,
        # which from training mode would leave batch norm and dropout training.
        self.module.eval()


def export_onnx(
    model: Captioner, folder: str | Path, opset: int | None = None, capacity: int | None = None
) -> list[Path]:
    """Write `folder`/onnx/{encoder,decoder_init,decoder_step}.onnx and onnx.json; returns their paths.
    `capacity` (default: decode.max_length) is baked into the step graph as its cache's steps."""
    if model.device.type != "cpu" or model.dtype != torch.float32 or model.training:
        model = copy.deepcopy(model).cpu().float()  # a copy: the caller's model stays as it was
    model.eval()
    opset = DEFAULT_OPSET if opset is None else opset
    capacity = model.decode_config.max_length if capacity is None else capacity
    if capacity < 1:
        raise ExportError(f"export: capacity must be >= 1 step, got {capacity}")
    out = Path(folder) / SUBFOLDER
    manifest_path = out / MANIFEST
    try:
        out.mkdir(parents=True, exist_ok=True)
        manifest_path.unlink(missing_ok=True)  # an older export's manifest never vouches for these graphs
    except OSError as e:
        raise ExportError(f"{out}: cannot write the export here ({e.strerror})") from None

    specs, summary = _graph_specs(model, capacity)
    paths = [out / GRAPH_FILES[spec.key] for spec in specs]
    exporters = {spec.key: _export_graph(spec, path, opset) for spec, path in zip(specs, paths)}
    check_parity(specs, paths)
    # The manifest last, atomically: a folder whose graphs failed the check has none. Bump ONNX_FORMAT_VERSION
    # whenever the graphs' inputs, outputs or onnx.json change.
    manifest = {
        "format": ONNX_FORMAT, "format_version": ONNX_FORMAT_VERSION,
        "captioner_version": captioner.__version__, "torch_version": torch.__version__, "opset": opset,
        "files": {
            spec.key: {"path": path.name, "sha256": sha256_of(path), **exporters[spec.key]}
            for spec, path in zip(specs, paths)
        },
        "graphs": {spec.key: {"inputs": spec.inputs, "outputs": spec.outputs} for spec in specs},
        **summary,  # memory, state, capacity, attention, spec
    }
    write_atomically(manifest_path, lambda tmp: tmp.write_text(json.dumps(manifest, indent=1)))
    return [*paths, manifest_path]


@torch.no_grad()
def _graph_specs(model: Captioner, capacity: int) -> tuple[list[GraphSpec], dict]:
    """The three graphs with example inputs (2 random images), and what onnx.json records of them."""
    decoder = model.decoder
    S = model.image_size
    images = torch.randint(0, 256, (2, 3, S, S), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    feats, grid = model.encode(images)  # (2, N, D)
    memory = decoder.prepare(feats)
    state = decoder.init_state(memory, capacity=capacity)
    memory_keys, state_keys = list(memory), list(state)
    bos = torch.full((2,), model.special_tokens.bos, dtype=torch.long)  # (2,)
    _, attn, _ = decoder.step(memory, bos, state)  # attn (2, L, H, N)
    # The state limits the steps only when its shapes depend on the capacity (a preallocated cache).
    roomier = decoder.init_state(memory, capacity=capacity + 1)
    grows = any(roomier[k].shape != state[k].shape for k in state_keys)
    memory_names = [f"memory.{k}" for k in memory_keys]
    state_names = [f"state.{k}" for k in state_keys]
    specs = [
        GraphSpec("encoder", EncoderGraph(model), (images,), ["images"], ["feats"]),
        GraphSpec(
            "decoder_init", DecoderInitGraph(decoder, memory_keys, state_keys, capacity), (feats,), ["feats"],
            [*memory_names, *state_names],
        ),
        GraphSpec(
            "decoder_step", DecoderStepGraph(decoder, memory_keys, state_keys),
            (*[memory[k] for k in memory_keys], bos, *[state[k] for k in state_keys]),
            [*memory_names, "prev_tokens", *state_names],
            ["logprobs", "attn", *[f"next_state.{k}" for k in state_keys]],
        ),
    ]
    summary = {
        "memory": memory_keys,
        "state": state_keys,
        "capacity": capacity if grows else None,  # steps the step graph's state holds; null: no limit
        "attention": {"layers": int(attn.shape[1]), "heads": int(attn.shape[2])},  # the step graph's attn (B, L, H, N)
        "spec": model.spec(tuple(grid)).to_dict(),  # vocabulary, special ids, input size, grid, decoding
    }
    return specs, summary


def _export_graph(spec: GraphSpec, path: Path, opset: int) -> dict[str, Any]:
    """Trace `spec.module` into `path` with a dynamic batch (TorchScript's exporter, else dynamo's)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
            torch.onnx.export(
                spec.module, spec.example, str(path), input_names=spec.inputs, output_names=spec.outputs,
                dynamic_axes={name: {0: "batch"} for name in [*spec.inputs, *spec.outputs]}, opset_version=opset,
                dynamo=False,
            )
        strip_trace_records(path)
        return {"exporter": "torchscript", "opset": opset}
    except Exception as torchscript_error:  # noqa: BLE001 - it raises many kinds; dynamo may still manage
        first_reason = " ".join(str(torchscript_error).split())[:160]
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                spec.module, spec.example, input_names=spec.inputs, output_names=spec.outputs,
                dynamic_shapes=_dynamic_batch(spec), opset_version=max(opset, DYNAMO_MIN_OPSET), dynamo=True,
                verbose=False,
            )
            program.save(str(path))
        strip_trace_records(path)
        return {"exporter": "dynamo", "opset": max(opset, DYNAMO_MIN_OPSET)}
    except Exception as e:  # noqa: BLE001
        reason = " ".join(str(e).split())[:160]
        raise ExportError(
            f"export: torch.onnx cannot export {path.name} (TorchScript: {first_reason}; dynamo: {reason})"
        ) from None


def strip_trace_records(path: Path) -> bool:
    """Drop the exporter's records of the tracing (doc strings, metadata naming the checkout's files)
    from the graph at `path`, its computation untouched; returns whether anything was dropped."""
    import onnx

    model = onnx.load(str(path))
    dropped = False
    graphs = [model.graph, *model.functions]
    while graphs:  # a graph's nodes, and the subgraphs their attributes hold
        graph = graphs.pop()
        for proto in (graph, *graph.node, *graph.input, *graph.output, *graph.value_info, *graph.initializer):
            if getattr(proto, "doc_string", ""):
                proto.doc_string, dropped = "", True
            if hasattr(proto, "metadata_props") and any(p.key.startswith(TRACE_KEYS) for p in proto.metadata_props):
                kept = [p for p in proto.metadata_props if not p.key.startswith(TRACE_KEYS)]
                del proto.metadata_props[:]
                proto.metadata_props.extend(kept)
                dropped = True
        graphs += [attribute.g for node in graph.node for attribute in node.attribute if attribute.HasField("g")]
        graphs += [g for node in graph.node for attribute in node.attribute for g in attribute.graphs]
    if dropped:
        onnx.save(model, str(path))
    return dropped


def _dynamic_batch(spec: GraphSpec) -> dict[str, Any]:
    """The dynamo exporter's dynamic shapes: dimension 0 of every input is the batch."""
    batch = torch.export.Dim("batch")
    params = list(inspect.signature(spec.module.forward).parameters.values())
    if params[0].kind is inspect.Parameter.VAR_POSITIONAL:
        return {params[0].name: tuple({0: batch} for _ in spec.example)}
    return {p.name: {0: batch} for p in params[: len(spec.example)]}


@torch.no_grad()
def check_parity(specs: list[GraphSpec], paths: list[Path], steps: int = 3) -> float:
    """The largest difference from torch's of the graphs run in onnxruntime on 3 random images (the
    traces saw 2) for `steps` greedy steps; over PARITY_TOLERANCE (scaled), an ExportError naming it."""
    import onnxruntime as ort

    sessions = {
        spec.key: ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for spec, path in zip(specs, paths)
    }
    worst = 0.0

    def compare(spec: GraphSpec, feed: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        nonlocal worst
        expected = spec.module(*feed)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = sessions[spec.key].run(spec.outputs, {n: t.numpy() for n, t in zip(spec.inputs, feed)})
        for name, want, have in zip(spec.outputs, expected, got):
            want = want.numpy()
            if want.shape != have.shape:
                raise ExportError(
                    f"export: {GRAPH_FILES[spec.key]} output {name} has shape {have.shape}, torch {want.shape}"
                )
            scale = max(1.0, float(np.abs(want).max(initial=0.0)))
            diff = float(np.abs(want.astype(np.float64) - have).max(initial=0.0)) / scale
            worst = max(worst, diff)
            if not diff <= PARITY_TOLERANCE:
                raise ExportError(f"export: {GRAPH_FILES[spec.key]} output {name} differs from torch by {diff:.2e} "
                                  f"(> {PARITY_TOLERANCE})")
        return [torch.from_numpy(x) for x in got]

    encoder, init, step = specs
    images = torch.randint(
        0, 256, (3, *encoder.example[0].shape[1:]), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    feats = compare(encoder, (images,))[0]  # (3, N, D)
    start = compare(init, (feats,))
    n_memory = len(init.outputs) - (len(step.outputs) - 2)  # init gives memory, then state; step each state
    memory, state = start[:n_memory], start[n_memory:]
    prev = step.example[n_memory][:1].expand(3).contiguous()  # (3,) <bos>
    for _ in range(steps):
        out = compare(step, (*memory, prev, *state))
        prev = out[0].argmax(dim=-1)  # (3,)
        state = out[2:]
    return worst
