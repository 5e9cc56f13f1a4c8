"""What decoding returns: a Caption with its words, scores and attention maps (T, L, H, h, w),
and `upsample`, which brings grid maps to image resolution for overlays and grounding."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Caption:
    text: str
    words: list[str]
    tokens: list[int]
    score: float  # length-normalised log-probability that ranked it
    logprob: float
    attn: torch.Tensor  # (T, L, H, h, w): every word's attention, per decoder layer and head
    finished: bool  # False when the maximum length cut it short
    # (T, L, H, T) when decoded with self_attention=True (transformers): at word t, the weights
    # each layer and head of the self-attention put on <bos> and the words before t, taken from
    # the pass that produced the caption.
    self_attn: torch.Tensor | None = None

    def heatmaps(self, layer: int = -1, head: int | None = None) -> torch.Tensor:
        """(T, h, w) maps for display: one layer, one head or the mean over heads (the default)."""
        maps = self.attn[:, layer]  # (T, H, h, w)
        return maps.mean(dim=1) if head is None else maps[:, head]  # (T, h, w)

    def to_json(self) -> dict:
        return {"caption": self.text, "score": round(self.score, 4), "logprob": round(self.logprob, 4), "finished": self.finished}


def upsample(maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(T, h, w) grid weights -> (T, H, W) smooth maps at image resolution, each summing to 1."""
    maps = F.interpolate(maps[:, None].float(), size=size, mode="bilinear", align_corners=False)[:, 0]  # (T, H, W)
    maps = maps.clamp_min(0)
    return maps / maps.sum(dim=(1, 2), keepdim=True).clamp_min(1e-12)
