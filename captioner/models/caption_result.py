"""What decoding returns: a Caption with its words, scores and attention maps (T, L, H, h, w),
and `upsample`, which brings grid maps to image resolution for overlays and grounding."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass
class Caption:
    """One caption of one image: its words, how decoding scored it, and where it looked."""

    text: str
    words: list[str]
    tokens: list[int]
    score: float  # length-normalised log-probability that ranked it
    logprob: float
    attn: torch.Tensor  # (T, L, H, h, w): every word's attention, per decoder layer and head
    finished: bool  # False when the maximum length cut it short
    # (T, L, H, T) with self_attention=True (transformers): at word t, the self-attention's
    # weights on <bos> and the words before t.
    self_attn: torch.Tensor | None = None

    def heatmaps(self, layer: int = -1, head: int | None = None) -> torch.Tensor:
        """(T, h, w) maps for display: one layer, one head or the mean over heads (the default)."""
        maps = self.attn[:, layer]  # (T, H, h, w)
        return maps.mean(dim=1) if head is None else maps[:, head]  # (T, h, w)

    def to_json(self) -> dict:
        return {
            "caption": self.text, "score": round(self.score, 4), "logprob": round(self.logprob, 4),
            "finished": self.finished,
        }


@functools.lru_cache(maxsize=64)
def linear_weights(source: int, target: int) -> torch.Tensor:
    """The (target, source) matrix R for which R @ v is F.interpolate's linear resize of v."""
    position = ((torch.arange(target, dtype=torch.float64) + 0.5) * (source / target) - 0.5).clamp_min(0)  # (target,)
    low = position.floor().long().clamp_max(source - 1)  # (target,)
    high = (low + 1).clamp_max(source - 1)  # (target,): the last point's neighbour is itself
    share = position - low  # (target,): the weight of `high`
    rows = torch.arange(target)
    weights = torch.zeros(target, source, dtype=torch.float64)
    weights.index_put_((rows, low), 1 - share, accumulate=True)
    weights.index_put_((rows, high), share, accumulate=True)
    return weights.float()


def upsample(maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(T, h, w) grid weights -> (T, H, W) maps at image resolution, each summing to 1: F.interpolate's
    bilinear map as two small products, faster (docs/results/bench_demo.json)."""
    rows = linear_weights(maps.shape[1], size[0]).to(maps.device)  # (H, h)
    columns = linear_weights(maps.shape[2], size[1]).to(maps.device)  # (W, w)
    maps = rows @ (maps.float() @ columns.T)  # (T, h, W) -> (T, H, W)
    # In place: page-faulting a fresh (T, H, W) buffer costs more than the arithmetic.
    maps.clamp_min_(0)
    return maps.div_(maps.sum(dim=(1, 2), keepdim=True).clamp_min_(1e-12))
