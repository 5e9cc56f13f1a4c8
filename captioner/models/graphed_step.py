"""The decoder step replayed as a CUDA graph while decoding (`decode.cuda_graphs`).

On a GPU one decoder step is a few hundred small kernels, so at inference its cost is launch
overhead. `torch.compile(mode="reduce-overhead")` fuses them and captures the step as a CUDA
graph that replays with one launch. At COCO sizes and 192 rows the transformer's step takes
2.32 ms eager and 0.75 ms replayed, the LSTM's 0.56 and 0.52 ms (docs/compile_step.md;
`python -m benchmarks cuda_graphs` times a trained model's decoding both ways).

Two rules of CUDA graphs shape this wrapper:

- A replay writes its outputs into the same memory as the replay before it, and without
  gradients every call starts a new replay. The state a step returns is the next step's input,
  and beam search keeps every step's attention maps, so the outputs are cloned before they are
  handed back (a few copies per step, timed with it in the figures above).
- Replays are serialised by a lock, and each one's outputs are cloned before the lock is
  released, so threads that decode at once (the demo) each get their own copies.

The graph is for inference only: with gradients (SCST's sampling), a keyword argument (the
transformer's `self_attention` inspection path) or a tensor off CUDA, the eager step runs.
Each distinct number of rows is its own graph (beam search's first step has one row per image,
then one per beam).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

import torch

from .decoder import Memory, State

Step = Callable[..., tuple[torch.Tensor, torch.Tensor, State]]


class GraphedStep:
    """Call as the decoder's `step`: the captured graph on CUDA without gradients, else `eager`."""

    device_type = "cuda"  # where the graph replays (the tests replay a stand-in on the CPU)

    def __init__(self, eager: Step) -> None:
        self.eager = eager
        self.graphed = torch.compile(eager, fullgraph=True, mode="reduce-overhead")
        self.lock = threading.Lock()

    def __call__(self, memory: Memory, prev_tokens: torch.Tensor, state: State, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, State]:
        if kwargs or torch.is_grad_enabled() or prev_tokens.device.type != self.device_type:
            return self.eager(memory, prev_tokens, state, **kwargs)
        with self.lock:
            torch.compiler.cudagraph_mark_step_begin()
            logprobs, attn, new_state = self.graphed(memory, prev_tokens, state)
            # The next replay overwrites these: hand back copies.
            return logprobs.clone(), attn.clone(), {key: value.clone() for key, value in new_state.items()}

    def __deepcopy__(self, memo: dict) -> GraphedStep:
        """A copied model (the ONNX export copies one) gets its own graphs and lock, over the
        copy's eager step."""
        return GraphedStep(copy.deepcopy(self.eager, memo))


def use_graphed_step(decoder: torch.nn.Module) -> GraphedStep:
    """From now on `decoder.step` is a GraphedStep over its own eager step (an instance attribute
    that shadows the method; parameters and checkpoints are untouched). Idempotent."""
    current = decoder.__dict__.get("step")
    if isinstance(current, GraphedStep):
        return current
    graphed = GraphedStep(type(decoder).step.__get__(decoder))
    decoder.__dict__["step"] = graphed
    return graphed
