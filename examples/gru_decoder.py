"""A third decoder in a file of its own, outside captioner: a GRU with additive attention.

Import this module before captioner reads a config (or declare it in your package's
`captioner.decoders` entry points), and `model.decoder.type: gru` trains, beam-searches, draws
heatmaps, exports and captions in the ONNX runtime like the two built-in decoders. docs/extending.md
walks through it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from captioner.core.config_sections import POSITIVE, PROBABILITY_BELOW_ONE, setting
from captioner.models.attention import AdditiveAttention
from captioner.models.decoder import Decoder, DecoderOutput, Memory, State, register_decoder


@dataclass
class GRUConfig:
    """`model.decoder` of `type: gru`."""

    embed_dim: int = setting(128, POSITIVE)  # word embedding size
    hidden_dim: int = setting(256, POSITIVE)  # GRU state size
    attention_dim: int = setting(128, POSITIVE)  # size of the additive attention's hidden layer
    dropout: float = setting(0.3, PROBABILITY_BELOW_ONE)  # before the output layer


@register_decoder("gru", GRUConfig)
class GRUDecoder(Decoder):
    """At step t: attend over the grid with h_{t-1}, run the GRU cell on [E y_{t-1}; c_t], predict from h_t."""

    def __init__(self, config: GRUConfig, vocab_size: int, feat_dim: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, config.embed_dim)
        self.attention = AdditiveAttention(feat_dim, config.hidden_dim, config.attention_dim)
        self.init_h = nn.Linear(feat_dim, config.hidden_dim)
        self.cell = nn.GRUCell(config.embed_dim + feat_dim, config.hidden_dim)
        self.out = nn.Linear(config.hidden_dim, vocab_size)
        self.dropout = nn.Dropout(config.dropout)

    def prepare(self, feats: torch.Tensor) -> Memory:
        return {"feats": feats, "projected": self.attention.project(feats)}  # (B, N, D), (B, N, A)

    def init_state(self, memory: Memory, capacity: int | None = None) -> State:
        return {"h": torch.tanh(self.init_h(memory["feats"].mean(dim=1)))}  # (B, H)

    def _advance(self, memory: Memory, prev_tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, ...]:
        context, weights = self.attention(memory["feats"], memory["projected"], state["h"])  # (B, D), (B, N)
        h = self.cell(torch.cat([self.embedding(prev_tokens), context], dim=1), state["h"])  # (B, H)
        return self.out(self.dropout(h)), weights[:, None, None, :], {"h": h}  # (B, V), (B, 1, 1, N)

    def step(self, memory: Memory, prev_tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        logits, attn, state = self._advance(memory, prev_tokens, state)
        return logits.log_softmax(dim=-1), attn, state  # (B, V), (B, 1, 1, N)

    def forward(self, feats: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor | None = None,
                image_rows: torch.Tensor | None = None, packed: bool = False) -> DecoderOutput:
        """Teacher forcing, one step per position: tokens (C, T) -> logits (C, T, V), attn (C, T, 1, 1, N)."""
        memory = self.caption_memory(feats, image_rows)  # one row per caption
        state = self.init_state(memory)
        logits, attn = [], []
        for t in range(tokens.shape[1]):
            out, weights, state = self._advance(memory, tokens[:, t], state)
            logits.append(out)
            attn.append(weights)
        return DecoderOutput(torch.stack(logits, dim=1), torch.stack(attn, dim=1))  # (C, T, V), (C, T, 1, 1, N)
