"""The interface every decoder implements, so training and decoding never look inside one.

    prepare(feats (B,N,D)) -> Memory                per-image constants, computed once per image
    init_state(memory, capacity) -> State           per-hypothesis state for `capacity` steps
    step(memory, prev_tokens (B,), state) -> (logprobs (B,V), attn (B,L,H,N), State)
    forward(feats (B,N,D), tokens (C,T), lengths, image_rows, packed)
        -> DecoderOutput(logits (C,T,V), attn (C,T,L,H,N))

Memory and State are dicts of batch-first tensors; beam search expands the memory once and reorders
only the state, which keeps one shape so a step compiles whole and can replay as a CUDA graph
(`GraphedStep`, `decode.cuda_graphs`). Maps are (L, H, N): layers, heads, cells."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn

from captioner.core import decoder_types

State = dict[str, torch.Tensor]
Memory = dict[str, torch.Tensor]


@dataclass
class DecoderOutput:
    logits: torch.Tensor  # (B, T, V); (M, V) when `positions` is set
    attn: torch.Tensor  # (B, T, L, H, N)
    self_attn: torch.Tensor | None = None  # (B, T, L, H, T): decoder self-attention, when asked for
    # (M,) long, for packed logits: row m of `logits` is position positions[m] of the flattened
    # (B*T); only the real positions (inside each caption) are there. None: `logits` is (B, T, V).
    positions: torch.Tensor | None = None


def select_rows(tensors: dict[str, torch.Tensor], index: torch.Tensor) -> dict[str, torch.Tensor]:
    """Pick rows of every batch-first tensor of a memory or state (beams, captions)."""
    return {key: value.index_select(0, index) for key, value in tensors.items()}


def reads_are_free(device: torch.device) -> bool:
    """Whether the host reads a tensor on `device` without waiting (the CPU): loops ask only there."""
    return device.type == "cpu"


def to_device_quietly(index: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`, pinned and non-blocking: the host never waits."""
    return index if index.device == torch.device(device) else _pinned_copy(index, device)


# Host bookkeeping, outside any compiled graph: dynamo cannot trace pin_memory. torch's own lazy form of
# torch.compiler.disable, which imports dynamo at the first call rather than here: about a second of every
# command's start, and a CPU run never calls it.
@torch._disable_dynamo
def _pinned_copy(index: torch.Tensor, device: torch.device) -> torch.Tensor:
    return index.pin_memory().to(device, non_blocking=True)


def real_positions(lengths: torch.Tensor, steps: int, device: torch.device) -> torch.Tensor:
    """lengths (C,) on the host -> (M,) long on `device`: the real positions of a flattened (C, steps)."""
    inside = torch.arange(steps)[None, :] < lengths[:, None]  # (C, steps)
    return to_device_quietly(inside.flatten().nonzero().squeeze(1), device)  # (M,)


class Decoder(nn.Module):
    """Built as `Decoder(config, vocab_size, feat_dim)` from its registered config dataclass."""

    vocab_size: int
    # True for decoders whose `step` takes self_attention=True and then returns the state with
    # "self_attn" (B, L, H, t+1): the weights its self-attention used at this step.
    has_self_attention: bool = False

    @property
    def attention_shape(self) -> tuple[int, int]:
        """(layers, heads) of its attention maps: (1, 1) unless it has several."""
        return (1, 1)

    def prepare(self, feats: torch.Tensor) -> Memory:
        raise NotImplementedError

    def expand_memory(self, memory: Memory, beams: int) -> Memory:
        """The memory for `beams` hypotheses per image, image b's rows consecutive; by default repeated."""
        first = next(iter(memory.values()))  # (B, ...)
        rows = torch.arange(first.shape[0], device=first.device).repeat_interleave(beams)  # (B*beams,)
        return select_rows(memory, rows)  # (B*beams, ...) each

    def init_state(self, memory: Memory, capacity: int | None = None) -> State:
        """The state before the first step, room for `capacity` steps (None: the decoder's default)."""
        raise NotImplementedError

    def step(self, memory: Memory, prev_tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        raise NotImplementedError

    def forward(
        self, feats: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor | None = None,
        image_rows: torch.Tensor | None = None, packed: bool = False,
    ) -> DecoderOutput:
        """Teacher forcing: feats (B, N, D), tokens (C, T); `image_rows` (C,): each caption's image. `lengths`
        (C,), longest first, lets it skip padding; `packed`, return the real positions alone."""
        raise NotImplementedError

    def caption_memory(self, feats: torch.Tensor, image_rows: torch.Tensor | None) -> Memory:
        """The `prepare`d feats (B, N, D), one row per caption when `image_rows` (C,) is given."""
        memory = self.prepare(feats)
        return memory if image_rows is None else select_rows(memory, image_rows)  # (C, ...) each

    def attention_penalty(self, attn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """A regulariser added to the loss (none by default): attn (B, T, L, H, N), mask (B, T) -> scalar."""
        return attn.new_zeros(())


D = TypeVar("D", bound=type[Decoder])


def register_decoder(name: str, config: type) -> Callable[[D], D]:
    """Class decorator: `model.decoder.type: name` builds this decoder from a `config` instance."""

    def register(module: D) -> D:
        decoder_types.register(name, config, module)
        return module

    return register


def build_decoder(config: Any, vocab_size: int, feat_dim: int) -> Decoder:
    """The registered decoder whose config class `config` is, over features of `feat_dim`."""
    return decoder_types.decoder_type(decoder_types.type_of(config)).module(config, vocab_size, feat_dim)


class GraphedStep:
    """Call as the decoder's `step`: a CUDA graph per number of rows, one launch for hundreds of kernels
    (docs/compile_step.md); with gradients, a keyword argument or a tensor off CUDA, `eager`."""

    device_type = "cuda"  # where the graph replays (the tests replay a stand-in on the CPU)

    def __init__(self, eager: Callable[..., tuple[torch.Tensor, torch.Tensor, State]]) -> None:
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
    """From now on `decoder.step` is a GraphedStep over its eager step (an instance attribute); idempotent."""
    if not isinstance(decoder.__dict__.get("step"), GraphedStep):
        decoder.__dict__["step"] = GraphedStep(type(decoder).step.__get__(decoder))
    return decoder.__dict__["step"]
