"""Attention over the grid of image features."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from captioner.models.dropout import Dropout
from captioner.models.products import onednn_linear, plain

BLOCK_BYTES = 4 << 20  # AdditiveAttention.attend's working block with several rows per image


def in_one_block(feats: torch.Tensor) -> bool:
    """Whether `attend` makes the (B, K, N, A) block of all rows at once: on a GPU (a launch per block)
    and in a compiled graph (docs/compile_step.md); a CPU's cache takes blocks of a few MB."""
    return feats.device.type != "cpu" or torch.compiler.is_compiling()


def hidden_layer(projected: torch.Tensor, query: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """sigmoid(2(W_h h + W_s s)): the doubled projection (n, N, A) and the query W_s s + b_s (n, A) ->
    (n, N, A), into `out` if given. The query is doubled before the add: the add's backward then only sums
    the (n, N, A) gradient for it, where alpha=2 would also scale all of it."""
    return torch.add(projected, (query * 2).unsqueeze(1), out=out).sigmoid_()  # (n, N, A)


class AdditiveAttention(nn.Module):
    """e_tij = w^T tanh(W_h h_ij + W_s s_{t-1}), a_tij = softmax_ij(e_tij), c_t = sum_ij a_tij h_ij;
    W_h h_ij once per image (`project`). tanh(x) is computed as 2 sigmoid(2x) - 1 (torch's CPU tanh is
    slower; within about 2e-7 in fp32): the projection and query doubled, the -1 and 2 in the score."""

    def __init__(self, feat_dim: int, state_dim: int, attention_dim: int) -> None:
        super().__init__()
        self.feat_proj = onednn_linear(nn.Linear(feat_dim, attention_dim))  # W_h
        self.state_proj = onednn_linear(nn.Linear(state_dim, attention_dim))  # W_s
        self.score = nn.Linear(attention_dim, 1)  # w

    def project(self, feats: torch.Tensor) -> torch.Tensor:
        """feats (B, N, D) -> 2 (W_h h_ij + b_h) (B, N, A): doubled for `attend`'s sigmoid."""
        return self.feat_proj(feats) * 2  # (B, N, A)

    def score_terms(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(2w (A,), b - w^T 1 (1,)): e_tij = 2 w^T sigmoid(.) + b - w^T 1, tanh's 2 and -1 in the score."""
        return self.score.weight[0] * 2, self.score.bias - self.score.weight.sum()

    def forward(
        self, feats: torch.Tensor, projected: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """feats (B, N, D), projected (B, N, A), state (R, S) -> context (R, D), weights (R, N); R = B or B*K."""
        return self.attend(feats, projected, self.state_proj(state))

    def attend(
        self, feats: torch.Tensor, projected: torch.Tensor, query: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As `forward` with query = W_s s_{t-1} + b_s (R, A) given; with R = B*K rows, image b's K
        consecutive rows read its grid in place, never copied."""
        B, R = projected.shape[0], query.shape[0]
        as_module = not plain(self.score)  # quantised, wrapped or hooked: the score layer runs as a module
        if R != B and (as_module or torch.is_grad_enabled()):  # the in-place block below has no gradient
            rows = torch.arange(B, device=feats.device).repeat_interleave(R // B)  # (R,): image rows expanded
            return self.attend(feats.index_select(0, rows), projected.index_select(0, rows), query)
        if as_module:  # e_tij as written, the score layer's weight unread; one row per image (expanded above)
            hidden = torch.tanh(projected / 2 + query.unsqueeze(1))  # (B, N, A): project() doubled W_h h + b_h
            weights = self.score(hidden).squeeze(-1).softmax(dim=-1)  # (B, N): a_tij
            return torch.bmm(weights.unsqueeze(1), feats).squeeze(1), weights  # (B, D), (B, N)
        score_weight, score_bias = self.score_terms()  # (A,), (1,)
        if R == B:
            hidden = hidden_layer(projected, query)  # (B, N, A)
            scores = torch.matmul(hidden, score_weight) + score_bias  # (B, N): e_tij
            weights = scores.softmax(dim=-1)  # (B, N): a_tij
            return torch.bmm(weights.unsqueeze(1), feats).squeeze(1), weights  # (B, D), (B, N)
        K = R // B
        queries = query.view(B, K, 1, -1)  # (B, K, 1, A)
        if in_one_block(feats):
            hidden = torch.add(projected[:, None], queries, alpha=2).sigmoid_()  # (B, K, N, A)
            scores = torch.matmul(hidden, score_weight.to(hidden.dtype))  # (B, K, N)
            weights = scores.add_(score_bias).softmax(dim=-1)  # (B, K, N): a_tij
            return torch.bmm(weights, feats).view(R, -1), weights.view(R, -1)  # (R, D), (R, N)
        # Images per block: a few MB stays in cache, and few blocks keep the parallel regions few.
        n = max(1, min(B, BLOCK_BYTES // (K * projected[0].numel() * projected.element_size())))
        block = projected.new_empty(n, K, *projected.shape[1:])  # (n, K, N, A), reused
        score_weight = score_weight.to(block.dtype)  # out= products take no autocast: the block's dtype
        scores = projected.new_empty(B, K, projected.shape[1])  # (B, K, N)
        for b in range(0, B, n):
            rows = block[: min(n, B - b)]  # (n, K, N, A); the last block may be short
            torch.add(projected[b : b + n, None], queries[b : b + n], alpha=2, out=rows).sigmoid_()  # (n, K, N, A)
            torch.matmul(rows, score_weight, out=scores[b : b + n])  # (n, K, N)
        weights = scores.add_(score_bias).softmax(dim=-1)  # (B, K, N): a_tij
        context = torch.bmm(weights, feats)  # (B, K, D): each image's grid read once for its K rows
        return context.view(R, -1), weights.view(R, -1)  # (R, D), (R, N)


class MultiHeadAttention(nn.Module):
    """weights = softmax(Q K^T / sqrt(d_k)) (returned before dropout), output = W_o concat_heads(weights V)
    over nh heads; keys and values are projected apart (`keys_values`), so they can be cached."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.q_proj = onednn_linear(nn.Linear(d_model, d_model))
        self.k_proj = onednn_linear(nn.Linear(d_model, d_model))
        self.v_proj = onednn_linear(nn.Linear(d_model, d_model))
        self.out_proj = onednn_linear(nn.Linear(d_model, d_model))
        self.dropout = Dropout(dropout)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, S, _ = x.shape
        return x.view(B, S, self.num_heads, self.head_dim).transpose(1, 2)  # (B, nh, S, hs)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, S, d) -> keys, values (B, nh, S, hs) each, contiguous: a cached grid is read in place."""
        return self.split_heads(self.k_proj(x)).contiguous(), self.split_heads(self.v_proj(x)).contiguous()

    def attend(
        self, query: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
        fused: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query (B, Tq, d), k and v (B, nh, Tk, hs), mask (B, nh, Tq, Tk) true where a query may look
        -> output (B, Tq, d), weights (B, nh, Tq, Tk), or None when `fused` (F.scaled_dot_product_attention)."""
        B, Tq, d = query.shape
        q = self.split_heads(self.q_proj(query))  # (B, nh, Tq, hs)
        if fused:
            p = self.dropout.p if self.training else 0.0
            out, weights = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p), None  # (B, nh, Tq, hs)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, nh, Tq, Tk)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = scores.softmax(dim=-1)  # (B, nh, Tq, Tk)
            out = self.dropout(weights) @ v  # (B, nh, Tq, hs)
        return self.out_proj(out.transpose(1, 2).reshape(B, Tq, d)), weights  # (B, Tq, d)

    def forward(
        self, query: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, Tq, d), keys (B, Tk, d) -> output (B, Tq, d), weights (B, nh, Tq, Tk)."""
        k, v = self.keys_values(keys)  # (B, nh, Tk, hs) each
        return self.attend(query, k, v, mask)
