"""The interface every decoder implements, so training and decoding never look inside one.

    prepare(feats (B,N,D)) -> Memory                per-image constants, computed once per image
    init_state(memory, capacity) -> State           per-hypothesis recurrent state for `capacity` steps
    step(memory, prev_tokens (B,), state) -> (logprobs (B,V), attn (B,L,H,N), State)
    forward(feats (B,N,D), tokens (B,T), lengths) -> DecoderOutput(logits (B,T,V), attn (B,T,L,H,N))

Memory and State are dicts of batch-first tensors. Beam search expands the memory to K rows per
image once (`expand_memory`) and reorders only the state, with one `index_select` per tensor
(`decoding.select_rows`). Splitting the per-image constants (the LSTM's projected grid W_h h_ij,
the transformer's cross-attention keys and values) out of the state keeps them from being copied
at every step of beam search; the LSTM does not expand its memory at all: its step reads one
image's grid for all K rows of that image.

The state's shapes never change from step to step (a decoder with a growing cache preallocates
it: `capacity` is the most steps the caller will run, the decoding functions' max_length; None
leaves the decoder's own default), and `step` reads nothing back from the device. So one step
compiles whole, once, with `torch.compile(fullgraph=True)` and can be replayed as a CUDA graph.

Attention maps are (L, H, N): layers by heads by grid cells. The LSTM has one layer and one head.

A decoder with self-attention (`has_self_attention`, the transformer) also takes
`step(..., self_attention=True)`, and then returns in its new state "self_attn" (B, L, H, t+1):
the weights that computed this step. The decoding functions take it out of the state, so the
fast path (no weights) stays the default for training and plain decoding. That inspection path
is the one exception to the rule above: cutting the weights to t+1 positions reads the position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

State = dict[str, torch.Tensor]
Memory = dict[str, torch.Tensor]


@dataclass
class DecoderOutput:
    logits: torch.Tensor  # (B, T, V)
    attn: torch.Tensor  # (B, T, L, H, N)
    self_attn: torch.Tensor | None = None  # (B, T, L, H, T): decoder self-attention, when asked for


class Decoder(nn.Module):
    vocab_size: int
    # True for decoders whose `step` takes self_attention=True and then returns the state with
    # "self_attn" (B, L, H, t+1): the weights its self-attention used at this step.
    has_self_attention: bool = False

    def prepare(self, feats: torch.Tensor) -> Memory:
        raise NotImplementedError

    def expand_memory(self, memory: Memory, beams: int) -> Memory:
        """The memory for `beams` hypotheses per image, where state rows b*beams .. b*beams+beams-1
        belong to image b (beam search). By default every tensor's rows are repeated; a decoder
        whose `step` reads one image's memory for all its rows returns the memory as it is."""
        B = next(iter(memory.values())).shape[0]
        rows = torch.arange(B, device=next(iter(memory.values())).device).repeat_interleave(beams)  # (B*beams,)
        return {key: value.index_select(0, rows) for key, value in memory.items()}

    def init_state(self, memory: Memory, capacity: int | None = None) -> State:
        """The state before the first step, with room for `capacity` steps (None: the decoder's default)."""
        raise NotImplementedError

    def step(self, memory: Memory, prev_tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        raise NotImplementedError

    def forward(self, feats: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor | None = None) -> DecoderOutput:
        """`lengths` (B,), sorted longest first, lets a recurrent decoder skip padded steps."""
        raise NotImplementedError

    def attention_penalty(self, attn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """A regulariser on the attention maps added to the loss; none by default.

        attn (B, T, L, H, N), mask (B, T) true at real (non-pad) positions -> scalar.
        """
        return attn.new_zeros(())
