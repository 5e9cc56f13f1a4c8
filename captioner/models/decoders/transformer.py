"""A transformer caption decoder (Vaswani et al. 2017) whose cross-attention looks at the grid."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from captioner.core.config_sections import POSITIVE, PROBABILITY_BELOW_ONE, setting
from captioner.core.specs import Choice, Flag
from captioner.models.attention import MultiHeadAttention
from captioner.models.decoder import Decoder, DecoderOutput, Memory, State, real_positions, register_decoder
from captioner.models.dropout import Dropout
from captioner.models.products import onednn_linear

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


@dataclass
class TransformerConfig:
    """`model.decoder` of `type: transformer`: its words embed at d_model."""

    d_model: int = setting(256, POSITIVE)  # model width
    num_layers: int = setting(2, POSITIVE)  # decoder layers
    num_heads: int = setting(4, POSITIVE)  # attention heads per layer (d_model must divide by it)
    ff_dim: int = setting(1024, POSITIVE)  # feed-forward width
    dropout: float = setting(0.5, PROBABILITY_BELOW_ONE)  # dropout in the decoder
    norm_first: bool = setting(False, Flag())  # post-norm as in Vaswani et al. (False) or pre-norm (True)
    tie_embeddings: bool = setting(True, Flag())  # share the input embedding and the output projection's weights
    grid_position_encoding: bool = setting(True, Flag())  # 2-D sinusoidal encoding of the grid cells
    activation: str = setting("relu", Choice(tuple(ACTIVATIONS)))  # of the feed-forward block

    def describe(self) -> str:
        """The architecture in words, for the model card."""
        return (f"transformer decoder ({self.num_layers} layers, {self.num_heads} heads; "
                "its cross-attention weights are the alignment maps)")

    def problem(self) -> str | None:
        """What is wrong with these keys together, if anything."""
        if self.d_model % self.num_heads:
            return (f"'model.decoder.d_model' ({self.d_model}) must be divisible by "
                    f"'model.decoder.num_heads' ({self.num_heads})")
        return None


def sinusoids(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """positions (...) -> (..., dim): PE(p, 2i) = sin(p / 10000^(2i/dim)), PE(p, 2i+1) = cos(...)."""
    half = (dim + 1) // 2
    freqs = torch.exp(torch.arange(half, device=positions.device) * (-2.0 * math.log(10000.0) / dim))  # (half,)
    angles = positions.float().unsqueeze(-1) * freqs  # (..., half)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)[..., :dim]  # (..., dim)


def grid_encoding(num_cells: int, dim: int, device: torch.device | None = None) -> torch.Tensor:
    """(N, dim) codes of a square grid's cells: the first dim // 2 channels the row, the rest the column
    (a non-square N: a 1-D code of the index)."""
    cells = torch.arange(num_cells, device=device)  # (N,)
    side = math.isqrt(num_cells)
    if side * side != num_cells:
        return sinusoids(cells, dim)  # (N, dim)
    rows, cols = cells // side, cells % side  # (N,) each
    return torch.cat([sinusoids(rows, dim // 2), sinusoids(cols, dim - dim // 2)], dim=-1)  # (N, dim)


def write_slot(buffer: torch.Tensor, new: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """buffer (B, nh, C, hs) with new (B, nh, 1, hs) written where slot (B, C) is true, out of place and
    in the buffer's dtype: one shape for CUDA graphs, the old state intact for autograd."""
    return torch.where(slot[:, None, :, None], new.to(buffer.dtype), buffer)  # (B, nh, C, hs)


class TransformerDecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the grid, feed-forward: residual blocks, post- or pre-norm."""

    def __init__(
        self, d_model: int, num_heads: int, ff_dim: int, dropout: float, norm_first: bool, activation: str
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout)
        self.ff = nn.Sequential(
            onednn_linear(nn.Linear(d_model, ff_dim)), ACTIVATIONS[activation](), Dropout(dropout),
            onednn_linear(nn.Linear(ff_dim, d_model)),
        )
        self.norm_self = nn.LayerNorm(d_model)
        self.norm_cross = nn.LayerNorm(d_model)
        self.norm_ff = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)

    def forward(
        self, x: torch.Tensor, cross_k: torch.Tensor, cross_v: torch.Tensor, mask: torch.Tensor | None = None,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None, slot: torch.Tensor | None = None,
        self_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x (B, T, d), cross_k/v (B, nh, N, hs), mask (B, nh, T, S) true where a position may look -> x,
        cross weights (B, nh, T, N), self k/v (B, nh, S, hs), self weights (B, nh, T, S) or None. A step
        (T = 1) writes its k/v into the `cache` (B, nh, C, hs) at `slot` (B, C), S = C; else S = T."""
        h = self._block_input(x, self.norm_self)
        k, v = self.self_attn.keys_values(h)  # (B, nh, T, hs) each
        if cache is not None and slot is not None:
            k, v = write_slot(cache[0], k, slot), write_slot(cache[1], v, slot)  # (B, nh, C, hs) each
        out, self_w = self.self_attn.attend(h, k, v, mask, fused=not self_weights)  # (B, T, d), (B, nh, T, S)
        x = self._residual(x, out, self.norm_self)
        h = self._block_input(x, self.norm_cross)
        out, weights = self.cross_attn.attend(h, cross_k, cross_v)  # (B, T, d), (B, nh, T, N)
        x = self._residual(x, out, self.norm_cross)
        return self._residual(x, self.ff(self._block_input(x, self.norm_ff)), self.norm_ff), weights, k, v, self_w

    def _block_input(self, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        """Pre-norm normalises what enters a block; post-norm what leaves the residual sum."""
        return norm(x) if self.norm_first else x

    def _residual(self, x: torch.Tensor, out: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        x = x + self.dropout(out)
        return x if self.norm_first else norm(x)


@register_decoder("transformer", TransformerConfig)
class TransformerDecoder(Decoder):
    """Embedding * sqrt(d_model) + sinusoidal positions, `num_layers` layers over the projected grid
    (+ a 2-D code per cell), a final LayerNorm (pre-norm only) and an output layer, optionally tied.
    Maps: every layer's and head's cross-attention; the state: a k/v cache per layer and the position."""

    has_self_attention = True
    # Positions the cache holds when `init_state` is not told: enough for `step` calls that do
    # not come from the decoding functions, which pass their max_length.
    default_capacity = 64

    def __init__(self, config: TransformerConfig, vocab_size: int, feat_dim: int) -> None:
        super().__init__()
        c = config
        self.vocab_size = vocab_size
        self.d_model = d_model = c.d_model
        self.grid_position_encoding = c.grid_position_encoding
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)  # unit scale after * sqrt(d_model)
        self.grid_proj = nn.Sequential(onednn_linear(nn.Linear(feat_dim, d_model)), nn.LayerNorm(d_model))
        self.layers = nn.ModuleList(
            TransformerDecoderLayer(d_model, c.num_heads, c.ff_dim, c.dropout, c.norm_first, c.activation)
            for _ in range(c.num_layers)
        )
        self.final_norm = nn.LayerNorm(d_model) if c.norm_first else nn.Identity()
        self.out = onednn_linear(nn.Linear(d_model, vocab_size))
        if c.tie_embeddings:
            self.out.weight = self.embedding.weight
        self.dropout = Dropout(c.dropout)

    @property
    def attention_shape(self) -> tuple[int, int]:
        return len(self.layers), self.layers[0].cross_attn.num_heads

    def _embed(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens (B, T), positions broadcastable to (B, T) -> (B, T, d)."""
        x = self.embedding(tokens) * math.sqrt(self.d_model)  # (B, T, d)
        return self.dropout(x + sinusoids(positions, self.d_model).to(x.dtype))  # (B, T, d)

    def prepare(self, feats: torch.Tensor) -> Memory:
        """feats (B, N, D) -> every layer's cross-attention keys and values, (B, nh, N, hs) each."""
        grid = self.grid_proj(feats)  # (B, N, d)
        if self.grid_position_encoding:
            grid = grid + grid_encoding(feats.shape[1], self.d_model, feats.device).to(grid.dtype)
        grid = self.dropout(grid)
        memory: Memory = {}
        for i, layer in enumerate(self.layers):
            memory[f"k_{i}"], memory[f"v_{i}"] = layer.cross_attn.keys_values(grid)  # (B, nh, N, hs) each
        return memory

    def init_state(self, memory: Memory, capacity: int | None = None) -> State:
        """A zeroed k/v cache per layer, (B, nh, capacity, hs) in the memory's dtype, and position 0 (B,)."""
        capacity = self.default_capacity if capacity is None else capacity
        if capacity < 1:
            raise ValueError(f"init_state: capacity must be >= 1 position; got {capacity}")
        k = memory["k_0"]  # (B, nh, N, hs)
        B, nh, _, hs = k.shape
        names = [f"{kv}_{i}" for i in range(len(self.layers)) for kv in "kv"]
        state: State = {name: k.new_zeros(B, nh, capacity, hs) for name in names}  # (B, nh, C, hs) each
        state["pos"] = torch.zeros(B, dtype=torch.long, device=k.device)  # (B,)
        return state

    def step(
        self, memory: Memory, prev_tokens: torch.Tensor, state: State, self_attention: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, State]:
        """prev_tokens (B,) -> logprobs (B, V), attn (B, L, nh, N), the state one position on; no read
        back from the device, except with `self_attention` (state["self_attn"] (B, L, nh, t+1))."""
        pos = state["pos"]  # (B,)
        capacity = state["k_0"].shape[2]
        torch._assert_async((pos < capacity).all(), "TransformerDecoder.step: more steps than init_state's capacity")
        slots = torch.arange(capacity, device=pos.device)  # (C,)
        slot = slots == pos[:, None]  # (B, C): where this position's keys and values go
        visible = (slots <= pos[:, None])[:, None, None, :]  # (B, 1, 1, C): positions 0..t
        x = self._embed(prev_tokens[:, None], pos[:, None])  # (B, 1, d)
        new_state: State = {}
        maps, self_maps = [], []
        for i, layer in enumerate(self.layers):
            cache = (state[f"k_{i}"], state[f"v_{i}"])
            x, w, new_state[f"k_{i}"], new_state[f"v_{i}"], self_w = layer(
                x, memory[f"k_{i}"], memory[f"v_{i}"], visible, cache, slot, self_weights=self_attention
            )
            maps.append(w[:, :, 0])  # (B, nh, N)
            if self_w is not None:
                self_maps.append(self_w[:, :, 0])  # (B, nh, C)
        new_state["pos"] = pos + 1
        if self_attention:
            seen = int(new_state["pos"].max())  # t+1: the host needs it to cut the slots never written
            new_state["self_attn"] = torch.stack(self_maps, dim=1)[..., :seen]  # (B, L, nh, t+1)
        logits = self.out(self.final_norm(x[:, 0]))  # (B, V)
        return logits.log_softmax(dim=-1), torch.stack(maps, dim=1), new_state  # (B, V), (B, L, nh, N)

    def forward(
        self, feats: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor | None = None,
        image_rows: torch.Tensor | None = None, packed: bool = False, self_attention: bool = False,
    ) -> DecoderOutput:
        """Teacher forcing as `Decoder.forward`, and with `self_attention` self_attn (C, T, L, nh, T)."""
        memory = self.caption_memory(feats, image_rows)  # (C, nh, N, hs) each
        T = tokens.shape[1]
        x = self._embed(tokens, torch.arange(T, device=tokens.device))  # (C, T, d)
        causal = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()  # (T, T): t sees 0..t
        maps, self_maps = [], []
        for i, layer in enumerate(self.layers):
            x, w, _, _, self_w = layer(
                x, memory[f"k_{i}"], memory[f"v_{i}"], causal, self_weights=self_attention
            )  # (C, T, d), (C, nh, T, N), (C, nh, T, T) or None
            maps.append(w.transpose(1, 2))  # (C, T, nh, N)
            if self_w is not None:
                self_maps.append(self_w.transpose(1, 2))  # (C, T, nh, T)
        self_attn = torch.stack(self_maps, dim=2) if self_attention else None  # (C, T, L, nh, T)
        if packed and lengths is not None:
            positions = real_positions(lengths, T, x.device)  # (M,)
            logits = self.out(self.final_norm(x.flatten(0, 1).index_select(0, positions)))  # (M, V)
            return DecoderOutput(logits, torch.stack(maps, dim=2), self_attn, positions)  # attn (C, T, L, nh, N)
        logits = self.out(self.final_norm(x))  # (C, T, V)
        return DecoderOutput(logits, torch.stack(maps, dim=2), self_attn)  # attn (C, T, L, nh, N)
