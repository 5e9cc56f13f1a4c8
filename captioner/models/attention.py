"""Attention over the grid of image features."""

from __future__ import annotations

import math

import torch
from torch import nn


class AdditiveAttention(nn.Module):
    """Bahdanau attention as in Show, Attend and Tell:

        e_tij = w^T tanh(W_h h_ij + W_s s_{t-1}),   a_tij = softmax_ij(e_tij),   c_t = sum_ij a_tij h_ij

    W_h h_ij depends only on the image, so `project` computes it once per image and every
    decoding step reuses it.
    """

    def __init__(self, feat_dim: int, state_dim: int, attention_dim: int) -> None:
        super().__init__()
        self.feat_proj = nn.Linear(feat_dim, attention_dim)  # W_h
        self.state_proj = nn.Linear(state_dim, attention_dim)  # W_s
        self.score = nn.Linear(attention_dim, 1)  # w

    def project(self, feats: torch.Tensor) -> torch.Tensor:
        return self.feat_proj(feats)  # (B, N, D) -> (B, N, A)

    def forward(self, feats: torch.Tensor, projected: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """feats (B, N, D), projected (B, N, A), state (B, S) -> context (B, D), weights (B, N)."""
        hidden = torch.tanh(projected + self.state_proj(state).unsqueeze(1))  # (B, N, A)
        scores = self.score(hidden).squeeze(-1)  # (B, N): e_tij
        weights = scores.softmax(dim=-1)  # (B, N): a_tij
        context = torch.bmm(weights.unsqueeze(1), feats).squeeze(1)  # (B, D)
        return context, weights
