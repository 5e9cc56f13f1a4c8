"""The Show, Attend and Tell decoder (Xu et al. 2015): an LSTM with soft additive attention."""

from __future__ import annotations

import torch
from torch import nn

from captioner.models.attention import AdditiveAttention
from captioner.models.decoder import Decoder, DecoderOutput, Memory, State


class LSTMDecoder(Decoder):
    """At step t: attend with s_{t-1}, gate the context, run the LSTM cell on [E y_{t-1}; z_t],
    and predict with the paper's deep output p(y_t) ~ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t)).

    The state starts from the mean feature (h_0 = tanh(W_init_h mean_ij h_ij), likewise c_0), and
    the doubly stochastic penalty on (1 - sum_t a_tij)^2 pushes the model to look at every part of
    the image over the course of a caption.
    """

    def __init__(
        self,
        vocab_size: int,
        feat_dim: int,
        embed_dim: int = 256,
        hidden_dim: int = 512,
        attention_dim: int = 256,
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.attention = AdditiveAttention(feat_dim, hidden_dim, attention_dim)
        self.init_h = nn.Linear(feat_dim, hidden_dim)
        self.init_c = nn.Linear(feat_dim, hidden_dim)
        self.gate = nn.Linear(hidden_dim, feat_dim)  # beta_t = sigmoid(f_beta(h_{t-1}))
        self.cell = nn.LSTMCell(embed_dim + feat_dim, hidden_dim)
        self.out_hidden = nn.Linear(hidden_dim, embed_dim)  # L_h
        self.out_context = nn.Linear(feat_dim, embed_dim)  # L_z
        self.out_vocab = nn.Linear(embed_dim, vocab_size)  # L_o
        self.dropout = nn.Dropout(dropout)

    def prepare(self, feats: torch.Tensor) -> Memory:
        return {"feats": feats, "projected": self.attention.project(feats)}  # (B, N, D), (B, N, A)

    def init_state(self, memory: Memory) -> State:
        mean = memory["feats"].mean(dim=1)  # (B, D)
        return {"h": torch.tanh(self.init_h(mean)), "c": torch.tanh(self.init_c(mean))}  # (B, H) each

    def _advance(self, memory: Memory, embedded: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        """One step from embedded previous words (B, E) -> logits (B, V), weights (B, N), state."""
        context, weights = self.attention(memory["feats"], memory["projected"], state["h"])  # (B, D), (B, N)
        context = torch.sigmoid(self.gate(state["h"])) * context  # (B, D): gated z_t
        h, c = self.cell(torch.cat([embedded, context], dim=1), (state["h"], state["c"]))  # (B, H) each
        deep = embedded + self.out_hidden(self.dropout(h)) + self.out_context(context)  # (B, E)
        logits = self.out_vocab(self.dropout(deep))  # (B, V)
        return logits, weights, {"h": h, "c": c}

    def step(self, memory: Memory, prev_tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        logits, weights, state = self._advance(memory, self.embedding(prev_tokens), state)
        return logits.log_softmax(dim=-1), weights[:, None, None, :], state  # (B, V), (B, 1, 1, N)

    def forward(self, feats: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor | None = None) -> DecoderOutput:
        """Teacher forcing: feats (B, N, D), tokens (B, T) -> logits (B, T, V), attn (B, T, 1, 1, N).

        With `lengths` (B,) sorted longest first, step t runs only the rows still inside their
        caption; outputs past a row's length are zero (they are padding and never scored).
        """
        B, T = tokens.shape
        memory = self.prepare(feats)
        state = self.init_state(memory)
        embedded = self.dropout(self.embedding(tokens))  # (B, T, E)
        logits = feats.new_zeros(B, T, self.vocab_size)  # (B, T, V)
        weights = feats.new_zeros(B, T, feats.shape[1])  # (B, T, N)
        if lengths is not None and bool((lengths[:-1] < lengths[1:]).any()):
            raise ValueError("lengths must be sorted longest first")
        for t in range(T):
            active = B if lengths is None else int((lengths > t).sum())
            if active == 0:
                break
            if active < state["h"].shape[0]:  # the shortest captions have ended: drop their rows
                memory = {k: v[:active] for k, v in memory.items()}
                state = {k: v[:active] for k, v in state.items()}
            logits[:active, t], weights[:active, t], state = self._advance(memory, embedded[:active, t], state)
        return DecoderOutput(logits, weights[:, :, None, None, :])  # attn (B, T, 1, 1, N)

    def attention_penalty(self, attn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(1 - sum_t a_tij)^2 over real steps, averaged over cells and the batch.

        The paper sums over cells; the mean (as in the best-known reproduction) keeps one
        penalty weight meaningful for a 7x7 and a 14x14 grid alike.
        """
        coverage = (attn[:, :, 0, 0, :] * mask.unsqueeze(-1)).sum(dim=1)  # (B, N)
        return ((1.0 - coverage) ** 2).mean()
