"""Time the decoder step that beam search and SCST call: eager versus torch.compile (inductor).

For each decoder of the COCO configs (configs/coco_{lstm,transformer}_resnet101.yaml: d_model 512,
3 layers, 8 heads for the transformer; 512-d embedding, LSTM and attention for the LSTM; a 14x14
grid of 2048-d ResNet-101 features, 10,000 words), one caption of decode.max_length steps over
images x beams rows, as beam search runs it (random weights, eval mode, no gradients):

- transformer, growing cache: the step as it was before the preallocated cache (keys and values
  appended with torch.cat, a new shape every step), eager;
- transformer and LSTM, static state (the preallocated cache; the LSTM's h and c): eager;
- each under `torch.compile(step, fullgraph=True)` with inductor: the first caption's time
  (every compilation it triggers included), the graphs compiled over all the captions (1: no
  recompiles) and the torch ops in each (each about one kernel launch per step in eager mode
  on a GPU: what a CUDA graph would replay at once).

Prints ms per step (the mean over one caption, the best of --repeats captions) side by side.

    python benchmarks/bench_compile_step.py [--images 16] [--beam 3] [--threads 1] [--device cpu]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

from captioner.core.config import load_config
from captioner.models.build import build_decoder
from captioner.models.decoder import Decoder, Memory, State
from captioner.models.transformer_decoder import TransformerDecoder

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
Step = Callable[[Memory, torch.Tensor, State], tuple[torch.Tensor, torch.Tensor, State]]


class Variant(NamedTuple):
    name: str
    init_state: Callable[[Memory], State]
    step: Step
    first_s: float = 0.0  # for a compiled step: the first caption's time, every compilation included
    graphs: CompileCounterWithBackend | None = None  # for a compiled step: graphs compiled, ops in them


def compiled_variant(
    name: str, init_state: Callable[[Memory], State], step: Step, memory: Memory, tokens: torch.Tensor
) -> Variant:
    """`step` under torch.compile(fullgraph=True, inductor), compiled by one first caption."""
    graphs = CompileCounterWithBackend("inductor")
    compiled = torch.compile(step, fullgraph=True, backend=graphs)
    first_s = caption_ms(init_state, compiled, memory, tokens) * tokens.shape[1] / 1000
    return Variant(name, init_state, compiled, first_s, graphs)


def growing_cache_step(decoder: TransformerDecoder) -> tuple[Callable[[Memory], State], Step]:
    """The former init_state and step: an empty cache (B, nh, 0, hs) that every step extends
    by one position with torch.cat, attended whole with no mask."""

    def init_state(memory: Memory) -> State:
        B, nh, _, hs = memory["k_0"].shape
        empty = memory["k_0"].new_zeros(B, nh, 0, hs)  # (B, nh, 0, hs)
        state = {key: empty for i in range(len(decoder.layers)) for key in (f"k_{i}", f"v_{i}")}
        return {**state, "pos": torch.zeros(B, dtype=torch.long, device=empty.device)}

    def step(memory: Memory, prev_tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        x = decoder._embed(prev_tokens[:, None], state["pos"][:, None])  # (B, 1, d)
        new_state: State = {"pos": state["pos"] + 1}
        maps = []
        for i, layer in enumerate(decoder.layers):
            h = layer._block_input(x, layer.norm_self)
            k, v = layer.self_attn.keys_values(h)  # (B, nh, 1, hs) each
            k = new_state[f"k_{i}"] = torch.cat([state[f"k_{i}"], k], dim=2)  # (B, nh, t+1, hs)
            v = new_state[f"v_{i}"] = torch.cat([state[f"v_{i}"], v], dim=2)  # (B, nh, t+1, hs)
            x = layer._residual(x, layer.self_attn.attend_fused(h, k, v), layer.norm_self)
            x, w = layer.cross_and_feed_forward(x, memory[f"k_{i}"], memory[f"v_{i}"])  # (B, 1, d), (B, nh, 1, N)
            maps.append(w[:, :, 0])  # (B, nh, N)
        logits = decoder.out(decoder.final_norm(x[:, 0]))  # (B, V)
        return logits.log_softmax(dim=-1), torch.stack(maps, dim=1), new_state  # (B, V), (B, L, nh, N)

    return init_state, step


def caption_ms(init_state: Callable[[Memory], State], step: Step, memory: Memory, tokens: torch.Tensor) -> float:
    """Wall time of one caption of tokens.shape[1] steps, in ms per step."""
    start = time.perf_counter()
    state = init_state(memory)
    for t in range(tokens.shape[1]):
        _, _, state = step(memory, tokens[:, t], state)
    if tokens.is_cuda:
        torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start) / tokens.shape[1]


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--beam", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3, help="timed captions per cell, best kept")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--decoders", nargs="+", default=["transformer", "lstm"], choices=["transformer", "lstm"])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = args.images * args.beam
    print(f"{rows} rows ({args.images} images x {args.beam} beams), {args.threads} threads, {device}, "
          f"torch {torch.__version__}")
    print(f"{'decoder':<12} {'step':<28} {'ms/step':>8} {'1st caption s':>12} {'graphs':>7} {'ops/graph':>9}")
    for kind in args.decoders:
        config = load_config(CONFIGS / f"coco_{kind}_resnet101.yaml", [])
        steps = config.decode.max_length
        torch.manual_seed(0)
        decoder = build_decoder(config, args.vocab, 2048).to(device).eval()
        feats = torch.randn(rows, 14 * 14, 2048, device=device)  # (B*K, N, D)
        tokens = torch.randint(4, args.vocab, (rows, steps), device=device)  # (B*K, T)
        memory = decoder.prepare(feats)  # once per image, as beam search does

        def init_state(memory: Memory, decoder: Decoder = decoder, steps: int = steps) -> State:
            return decoder.init_state(memory, capacity=steps)

        torch._dynamo.reset()
        # The static step compiles first, so its compile time is not shortened by kernels that
        # the growing step's compilation left in inductor's cache.
        variants = [
            Variant("static state, eager", init_state, decoder.step),
            compiled_variant("static state, inductor", init_state, decoder.step, memory, tokens),
        ]
        if isinstance(decoder, TransformerDecoder):
            growing_init, growing_step = growing_cache_step(decoder)
            variants.append(Variant("growing cache, eager", growing_init, growing_step))
            variants.append(compiled_variant("growing cache, inductor", growing_init, growing_step, memory, tokens))
        # Round robin, best of --repeats: a burst of load from other processes hits every variant alike.
        times: list[list[float]] = [[] for _ in variants]
        for _ in range(args.repeats):
            for variant, kept in zip(variants, times):
                kept.append(caption_ms(variant.init_state, variant.step, memory, tokens))
        for variant, kept in zip(variants, times):
            line = f"{kind:<12} {variant.name:<28} {min(kept):>8.2f}"
            if variant.graphs is not None:
                graphs = variant.graphs.frame_count
                line += f" {variant.first_s:>12.1f} {graphs:>7} {variant.graphs.op_count // graphs:>9}"
            print(line)


if __name__ == "__main__":
    main()
