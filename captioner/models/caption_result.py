"""What decoding returns: a Caption with its words, scores and attention maps (T, L, H, h, w), kept in
core/decode_results.py for the ONNX runtime too, and `upsample`, which brings grid maps to image
resolution for overlays and grounding."""

from __future__ import annotations

import functools

import torch

from captioner.core.decode_results import Caption  # noqa: F401  (imported from here by its callers)


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
