"""Dropout with the same law as `nn.Dropout`, its CPU mask drawn by `torch.rand`.

ATen's CPU `bernoulli_` with a scalar p takes MKL's vectorised generator on Intel processors only and
elsewhere draws one element at a time, several times slower than `torch.rand` for the same mask (records
`bench_decoder_step`). Elsewhere, and out of training, `nn.Dropout` itself."""

from __future__ import annotations

import torch
from torch import nn


class Dropout(nn.Dropout):
    """`nn.Dropout` (its parameters, state dict and modes); on the CPU in training the kept elements
    are where a uniform draw in float32 is at least p, each scaled by 1 / (1 - p)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.inplace or self.p in (0.0, 1.0) or x.device.type != "cpu":
            return super().forward(x)
        keep = torch.rand(x.shape, dtype=torch.float32) >= self.p  # (...): float32 draws, whatever x's dtype
        return x * keep * (1.0 / (1.0 - self.p))
