"""Attention over the grid of image features."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
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
        return self.attend(feats, projected, self.state_proj(state))

    def attend(self, feats: torch.Tensor, projected: torch.Tensor, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As `forward` with the state already projected: query = W_s s_{t-1} (B, A), so a caller
        can compute it in one product with other functions of the same state."""
        hidden = (projected + query.unsqueeze(1)).tanh_()  # (B, N, A); in place: one buffer this size, not two
        scores = self.score(hidden).squeeze(-1)  # (B, N): e_tij
        weights = scores.softmax(dim=-1)  # (B, N): a_tij
        context = torch.bmm(weights.unsqueeze(1), feats).squeeze(1)  # (B, D)
        return context, weights


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over nh heads (Vaswani et al. 2017), written out so that the
    weights come back with the output:

        weights = softmax(Q K^T / sqrt(d_k)),   output = W_o concat_heads(weights V)

    Keys and values are projected by `keys_values` and attended by `attend`, so a decoder can
    project its grid once per image and its own past positions once per step (a key/value cache).
    Dropout falls on the weights used for the sum only in training; the weights returned are the
    ones before dropout, so each row is a distribution over the keys.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        return x.view(B, S, self.num_heads, self.head_dim).transpose(1, 2)  # (B, nh, S, hs)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, S, d) -> keys, values (B, nh, S, hs) each, contiguous: a cached grid is then read
        in place at every step instead of being copied by each matmul."""
        return self.split_heads(self.k_proj(x)).contiguous(), self.split_heads(self.v_proj(x)).contiguous()

    def attend(
        self, query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, Tq, d), k and v (B, nh, Tk, hs), mask broadcastable to (B, nh, Tq, Tk), true
        where a query may look -> output (B, Tq, d), weights (B, nh, Tq, Tk)."""
        B, Tq, d = query.shape
        q = self.split_heads(self.q_proj(query))  # (B, nh, Tq, hs)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, nh, Tq, Tk)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)  # (B, nh, Tq, Tk)
        out = self.dropout(weights) @ v  # (B, nh, Tq, hs)
        out = out.transpose(1, 2).reshape(B, Tq, d)  # (B, Tq, d)
        return self.out_proj(out), weights

    def attend_fused(
        self, query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`attend` without the weights, through F.scaled_dot_product_attention (a fused kernel
        that never materialises them): query (B, Tq, d), k and v (B, nh, Tk, hs) -> (B, Tq, d).
        For attention whose maps nobody reads, such as the decoder's self-attention."""
        B, Tq, d = query.shape
        q = self.split_heads(self.q_proj(query))  # (B, nh, Tq, hs)
        p = self.dropout.p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (B, nh, Tq, hs)
        return self.out_proj(out.transpose(1, 2).reshape(B, Tq, d))  # (B, Tq, d)

    def forward(
        self, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, Tq, d), keys (B, Tk, d) -> output (B, Tq, d), weights (B, nh, Tq, Tk)."""
        k, v = self.keys_values(keys)  # (B, nh, Tk, hs) each
        return self.attend(query, k, v, mask)
