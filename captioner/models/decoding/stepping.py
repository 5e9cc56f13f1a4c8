"""What the decoding loops share: one decoder step, the hypothesis a loop returns, and the row
bookkeeping of a batch that shrinks as its rows end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from captioner.models.decoder import Decoder

SHRINK_SHARE = 8  # drop ended rows once they are an eighth of those stepping (each drop copies the memory)


@dataclass
class Hypothesis:
    tokens: list[int]  # word ids, without <bos> and <eos>
    score: float  # total log-probability, divided by the length penalty
    logprob: float  # total log-probability, <eos> included when the caption ended
    attn: torch.Tensor  # (T, L, H, N): the attention at each word
    finished: bool  # False when max_length was reached before <eos>
    # (T, L, H, T) when asked for: at word t, the decoder's self-attention over the input
    # positions 0..t (<bos>, then the words before t); zero on later positions.
    self_attn: torch.Tensor | None = None


def step_decoder(
    decoder: Decoder,
    memory: dict[str, torch.Tensor],
    prev: torch.Tensor,
    state: dict[str, torch.Tensor],
    self_attention: bool,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
    """One decoder step; with `self_attention` (decoders that have it) also its self-attention
    weights (R, L, H, t+1), taken out of the state; else None."""
    if not (self_attention and decoder.has_self_attention):
        logprobs, attn, state = decoder.step(memory, prev, state)
        return logprobs, attn, state, None
    logprobs, attn, state = decoder.step(memory, prev, state, self_attention=True)  # type: ignore[call-arg]
    state = dict(state)
    return logprobs, attn, state, state.pop("self_attn")


def pad_last(x: torch.Tensor, size: int) -> torch.Tensor:
    """Zero-pad the last dimension of x to `size`."""
    return torch.nn.functional.pad(x, (0, size - x.shape[-1]))


def spread_rows(x: torch.Tensor, rows: torch.Tensor, total: int, fill: float) -> torch.Tensor:
    """x (A, ...) as rows `rows` (A,) of a (total, ...) tensor whose other rows are `fill`."""
    return x.new_full((total, *x.shape[1:]), fill).index_copy_(0, rows, x)  # (total, ...)


def device_index(index: list[int], device: torch.device) -> torch.Tensor:
    """A host list of row indices as a long tensor on `device`, copied without blocking."""
    rows = torch.tensor(index, dtype=torch.long)  # (W,)
    if torch.device(device).type == "cuda":
        rows = rows.pin_memory()
    return rows.to(device, non_blocking=True)
