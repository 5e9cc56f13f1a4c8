"""The decoder step replayed as a CUDA graph while decoding (`decode.cuda_graphs`): one launch instead of
hundreds of small kernels (docs/compile_step.md; `python -m benchmarks cuda_graphs`). Each number of rows
is its own graph; with gradients, a keyword argument or a tensor off CUDA the eager step runs."""

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

    def __call__(
        self, memory: Memory, prev_tokens: torch.Tensor, state: State, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor, State]:
        if kwargs or torch.is_grad_enabled() or prev_tokens.device.type != self.device_type:
            return self.eager(memory, prev_tokens, state, **kwargs)
        with self.lock:
            torch.compiler.cudagraph_mark_step_begin()
            logprobs, attn, new_state = self.graphed(memory, prev_tokens, state)
            # The next replay overwrites these (hence the lock too): hand back copies.
            return logprobs.clone(), attn.clone(), {key: value.clone() for key, value in new_state.items()}

    def __deepcopy__(self, memo: dict) -> GraphedStep:
        """A copied model gets its own graphs and lock, over the copy's eager step."""
        return GraphedStep(copy.deepcopy(self.eager, memo))


def use_graphed_step(decoder: torch.nn.Module) -> GraphedStep:
    """From now on `decoder.step` is a GraphedStep over its eager step (an instance attribute
    shadowing the method; parameters untouched). Idempotent."""
    current = decoder.__dict__.get("step")
    if isinstance(current, GraphedStep):
        return current
    graphed = GraphedStep(type(decoder).step.__get__(decoder))
    decoder.__dict__["step"] = graphed
    return graphed
