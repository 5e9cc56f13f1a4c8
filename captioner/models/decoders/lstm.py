"""The Show, Attend and Tell decoder (Xu et al. 2015): an LSTM with soft additive attention."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from captioner.core.config_sections import POSITIVE, PROBABILITY_BELOW_ONE, setting
from captioner.models.attention import AdditiveAttention
from captioner.models.decoder import (
    Decoder, DecoderOutput, Memory, State, register_decoder, select_rows, to_device_quietly
)
from captioner.models.dropout import Dropout
from captioner.models.products import gram, linear, onednn_linear, plain, prepared
from captioner.models.recurrent_attention import RecurrentAttention, row_prefixes


@dataclass
class LSTMConfig:
    """`model.decoder` of `type: lstm`: Show, Attend and Tell."""

    embed_dim: int = setting(256, POSITIVE)  # word embedding size
    dropout: float = setting(0.5, PROBABILITY_BELOW_ONE)  # dropout in the decoder
    hidden_dim: int = setting(512, POSITIVE)  # hidden and cell state size
    attention_dim: int = setting(256, POSITIVE)  # size of the additive attention's hidden layer

    def describe(self) -> str:
        """The architecture in words, for the model card."""
        return ("Show, Attend and Tell LSTM (additive attention over the grid, gated context, "
                "doubly stochastic attention penalty)")


@register_decoder("lstm", LSTMConfig)
class LSTMDecoder(Decoder):
    """Step t: attend with h_{t-1}, gate the context z_t, run the LSTM cell on [E y_{t-1}; z_t], predict
    p(y_t) ~ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t)); h_0, c_0 = tanh(W mean_ij a_ij)."""

    def __init__(self, config: LSTMConfig, vocab_size: int, feat_dim: int) -> None:
        super().__init__()
        embed_dim, hidden_dim = config.embed_dim, config.hidden_dim
        self.vocab_size, self.embed_dim = vocab_size, embed_dim
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.attention = AdditiveAttention(feat_dim, hidden_dim, config.attention_dim)
        self.init_h = onednn_linear(nn.Linear(feat_dim, hidden_dim))
        self.init_c = onednn_linear(nn.Linear(feat_dim, hidden_dim))
        self.gate = onednn_linear(nn.Linear(hidden_dim, feat_dim))  # beta_t = sigmoid(f_beta(h_{t-1}))
        self.cell = nn.LSTMCell(embed_dim + feat_dim, hidden_dim)
        self.out_hidden = onednn_linear(nn.Linear(hidden_dim, embed_dim))  # L_h
        self.out_context = onednn_linear(nn.Linear(feat_dim, embed_dim))  # L_z
        self.out_vocab = onednn_linear(nn.Linear(embed_dim, vocab_size))  # L_o
        self.dropout = Dropout(config.dropout)

    def prepare(self, feats: torch.Tensor) -> Memory:
        return {"feats": feats, "projected": self.attention.project(feats)}  # (B, N, D), (B, N, A)

    def expand_memory(self, memory: Memory, beams: int) -> Memory:
        """The memory as it is: the K rows of an image attend over its one copy of the grid."""
        return memory

    def init_state(self, memory: Memory, capacity: int | None = None) -> State:
        """h_0, c_0 from the mean feature; `capacity` is unused (the state has one size)."""
        mean = memory["feats"].mean(dim=1)  # (B, D)
        return {"h": torch.tanh(self.init_h(mean)), "c": torch.tanh(self.init_c(mean))}  # (B, H) each

    def _output(self, embedded: torch.Tensor, h: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """The deep output: embedded (..., E), h (..., H), gated context (..., D) -> logits (..., V)."""
        deep = embedded + self.out_hidden(self.dropout(h)) + self.out_context(context)  # (..., E)
        return self.out_vocab(self.dropout(deep))  # (..., V)

    def _advance(
        self, memory: Memory, embedded: torch.Tensor, state: State
    ) -> tuple[torch.Tensor, torch.Tensor, State]:
        """One step from embedded previous words (B, E) -> logits (B, V), weights (B, N), state."""
        context, weights = self.attention(memory["feats"], memory["projected"], state["h"])  # (B, D), (B, N)
        context = torch.sigmoid(self.gate(state["h"])) * context  # (B, D): gated z_t
        cell = self.cell  # nn.LSTMCell's parameters and arithmetic, its products through `linear`
        gates = linear(torch.cat([embedded, context], dim=1), cell.weight_ih, cell.bias_ih) + linear(
            state["h"], cell.weight_hh, cell.bias_hh
        )  # (B, 4H)
        h, c = lstm_update(gates, state["c"])  # (B, H) each
        return self._output(embedded, h, context), weights, {"h": h, "c": c}  # (B, V), (B, N)

    def step(self, memory: Memory, prev_tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        logits, weights, state = self._advance(memory, self.embedding(prev_tokens), state)
        return logits.log_softmax(dim=-1), weights[:, None, None, :], state  # (B, V), (B, 1, 1, N)

    def forward(
        self, feats: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor | None = None,
        image_rows: torch.Tensor | None = None, packed: bool = False,
    ) -> DecoderOutput:
        """Teacher forcing as `Decoder.forward`, `step`'s numbers with only the recurrence in the time loop:
        logits (C, T, V), zero past each length, or with `packed` (M, V) time-major; attn (C, T, 1, 1, N)."""
        C, T = tokens.shape
        if not (plain(self.attention.state_proj) and plain(self.gate)):  # quantised, wrapped, hooked: own forwards
            return self._forward_by_steps(feats, tokens, lengths, image_rows)
        active = active_rows(lengths, C, T)  # rows inside their caption at each step, non-increasing
        if not active:  # no caption has a single step: all padding
            return DecoderOutput(feats.new_zeros(C, T, self.vocab_size), feats.new_zeros(C, T, 1, 1, feats.shape[1]))
        memory = self.prepare(feats)  # once per image
        state = self.init_state(memory)
        if image_rows is not None:  # one row per caption
            memory, state = select_rows(memory, image_rows), select_rows(state, image_rows)  # (C, ...) each
        H, D = self.cell.hidden_size, feats.shape[-1]
        w_hh = self.cell.weight_hh  # (4H, H)
        # Split, not sliced: a split's backward is one cat, each slice's a zero-filled copy of the whole.
        w_embedded, w_context = self.cell.weight_ih.split((self.embed_dim, D), dim=1)  # (4H, E), (4H, D)
        padded = not (len(active) == T and active[-1] == C)
        if padded:
            # Real positions in time-major order and where they sit in (C*T); nothing is made for padding.
            positions = torch.tensor([t + c * T for t, n in enumerate(active) for c in range(n)])  # (M,)
            rows = to_device_quietly(positions, feats.device)  # (M,)
            words = tokens.flatten().index_select(0, rows)  # (M,)
        else:
            words = tokens.flatten()  # (C*T,), batch-major
        embedded = self.dropout(self.embedding(words))  # (M, E)
        # The embedding's share of the cell input, for every step at once; biases folded in.
        cell_in = linear(embedded, w_embedded, self.cell.bias_ih + self.cell.bias_hh)  # (M, 4H)
        # One block per step, cut once, so backward joins one gradient, not T.
        cell_in = cell_in.split(active) if padded else cell_in.view(C, T, 4 * H).unbind(1)  # T x (n_t, 4H)
        # The products of h_{t-1} and z_t at every step, each weight's gradient one product over all steps.
        context_product = RecurrentProduct(w_context.t())  # (D, 4H)
        # One product of h_{t-1} per step: attention query W_s, gate f_beta and the recurrent weights.
        w_state = torch.cat([self.attention.state_proj.weight, self.gate.weight, w_hh]).t()  # (H, A + D + 4H)
        state_product = RecurrentProduct(w_state)
        b_state = torch.cat([self.attention.state_proj.bias, self.gate.bias, w_hh.new_zeros(4 * H)])  # (A + D + 4H,)
        A = self.attention.state_proj.out_features
        # The grid's rows for each number of captions still running, all cut from the full memory at once.
        sizes = list(dict.fromkeys(active))  # distinct, non-increasing
        feats_for = dict(zip(sizes, row_prefixes(memory["feats"], sizes)))  # n -> (n, N, D)
        attend = RecurrentAttention(self.attention, memory["projected"], active)
        steps = []  # (h, context, weights) of each step
        for t, n in enumerate(active):
            if n < state["h"].shape[0]:  # the shortest captions have ended: drop their rows
                state = {k: v[:n] for k, v in state.items()}
            query, gate, recurrent = (state_product(state["h"]) + b_state).split((A, D, 4 * H), dim=1)
            context, weights = attend(t, feats_for[n], query)  # (n, D), (n, N)
            context = torch.sigmoid(gate) * context  # (n, D): gated z_t
            gates = context_product(context) + (cell_in[t] + recurrent)  # (n, 4H)
            h, c = lstm_update(gates, state["c"])  # (n, H) each
            state = {"h": h, "c": c}
            steps.append((h, context, weights))
        hs, contexts, maps = zip(*steps)  # T x (n_t, H), (n_t, D), (n_t, N)
        if not padded:  # batch-major outputs directly, nothing to scatter
            hs_, contexts_ = torch.stack(hs, dim=1), torch.stack(contexts, dim=1)  # (C, T, H), (C, T, D)
            logits = self._output(embedded.view(C, T, -1), hs_, contexts_)  # (C, T, V)
            return DecoderOutput(logits, torch.stack(maps, dim=1)[:, :, None, None, :])  # attn (C, T, 1, 1, N)
        logits = self._output(embedded, torch.cat(hs), torch.cat(contexts))  # (M, V)
        maps_real = torch.cat(maps)  # (M, N)
        # The maps' own dtype: under CUDA autocast they are float32 while h is bf16, and CUDA's
        # index_copy does not promote (CPU's does).
        attn = maps_real.new_zeros(C * T, feats.shape[1]).index_copy(0, rows, maps_real).view(C, T, -1)  # (C, T, N)
        if packed:
            return DecoderOutput(logits, attn[:, :, None, None, :], positions=rows)  # (M, V), attn (C, T, 1, 1, N)
        logits = logits.new_zeros(C * T, self.vocab_size).index_copy(0, rows, logits).view(C, T, -1)  # (C, T, V)
        return DecoderOutput(logits, attn[:, :, None, None, :])  # attn (C, T, 1, 1, N)

    def _forward_by_steps(
        self, feats: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor | None, image_rows: torch.Tensor | None
    ) -> DecoderOutput:
        """Teacher forcing one `_advance` at a time, for layers the fused forward must not read (quantised)."""
        memory, T = self.caption_memory(feats, image_rows), tokens.shape[1]  # (C, ...) each
        state = self.init_state(memory)
        embedded = self.dropout(self.embedding(tokens))  # (C, T, E)
        steps = []
        for t in range(T):
            *outputs, state = self._advance(memory, embedded[:, t], state)  # logits (C, V), weights (C, N)
            steps.append(outputs)
        logits_all, attn = (torch.stack(x, dim=1) for x in zip(*steps))  # (C, T, V), (C, T, N)
        if lengths is not None:
            inside = (torch.arange(T)[None, :] < lengths.cpu()[:, None]).to(feats.device)  # (C, T)
            logits_all, attn = logits_all * inside[..., None], attn * inside[..., None]
        return DecoderOutput(logits_all, attn[:, :, None, None, :])  # attn (C, T, 1, 1, N)

    def attention_penalty(self, attn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(1 - sum_t a_tij)^2, averaged over cells and batch (the paper sums) so one weight fits any grid."""
        coverage = (attn[:, :, 0, 0, :] * mask.unsqueeze(-1)).sum(dim=1)  # (B, N)
        return ((1.0 - coverage) ** 2).mean()


def lstm_update(gates: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """nn.LSTMCell's update: gates (n, 4H) in its order (i, f, g, o), c_{t-1} (n, H) -> h_t, c_t."""
    i, f, g, o = gates.chunk(4, dim=1)  # (n, H) each
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)  # (n, H)
    return torch.sigmoid(o) * torch.tanh(c), c  # (n, H) each


def active_rows(lengths: torch.Tensor | None, batch: int, steps: int) -> list[int]:
    """How many rows are inside their caption at each step (trailing zeros cut), `lengths` longest first."""
    if lengths is None:
        return [batch] * steps
    values = lengths.tolist()  # one read; the counts below are plain Python
    if any(a < b for a, b in zip(values, values[1:])):
        raise ValueError("lengths must be sorted longest first")
    ascending = values[::-1]
    counts = [batch - bisect.bisect_right(ascending, t) for t in range(steps)]  # the lengths over t
    return [n for n in counts if n]  # non-increasing: only trailing zeros go


class RecurrentProduct:
    """x_t @ w at every step of a recurrence, w's gradient X^T G one product after the last step's
    backward, not T; under autocast, torch.compile or without w's gradient, autograd's own product."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.collected: list[tuple[torch.Tensor, torch.Tensor]] = []  # (x_t, g_t) per step, filled by backward
        self.deferred = torch.is_grad_enabled() and weight.requires_grad and not (
            torch.is_autocast_enabled(weight.device.type) or torch.compiler.is_compiling()
        )
        self.weight = _SharedWeight.apply(weight, self.collected) if self.deferred else weight  # (I, O)
        plain = torch.is_grad_enabled() and not self.deferred  # autograd differentiates the product itself
        self.forward = (lambda x: x @ weight) if plain else prepared(weight.t())  # x (n, I) -> x @ w (n, O)
        self._weight = weight

    @functools.cached_property
    def backward(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """grad (n, O) -> grad @ w^T (n, I); w prepared at the first step's backward."""
        return prepared(self._weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (n, I) -> x @ w (n, O)."""
        return _StepProduct.apply(x, self.weight, self) if self.deferred else self.forward(x)


class _SharedWeight(torch.autograd.Function):
    """The weight as every step sees it; its backward, after theirs, sums what they collected."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, collected: list) -> torch.Tensor:  # type: ignore[override]
        ctx.collected = collected
        ctx.set_materialize_grads(False)  # the steps pass it no gradient: no zero matrix is made for it
        return weight.view_as(weight)  # (I, O)

    @staticmethod
    def backward(ctx, _unused: torch.Tensor | None) -> tuple[torch.Tensor | None, None]:  # type: ignore[override]
        if not ctx.collected:
            return None, None
        inputs, grads = zip(*ctx.collected)
        ctx.collected.clear()  # free the steps' tensors now
        # Made (O, I) and handed back transposed: a weight split from a wider one (the cell's w_ih) then
        # joins its gradient row by row, where an (I, O) block would be gathered column by column.
        return gram(torch.cat(grads), torch.cat(inputs)).t(), None  # (I, O): sum_t x_t^T g_t


class _StepProduct(torch.autograd.Function):
    """x @ w for one step; backward: x's gradient g w^T, and (x, g) handed on for w's."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, x: torch.Tensor, weight: torch.Tensor, product: RecurrentProduct
    ) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.product = product
        return product.forward(x)  # (n, O)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        ctx.product.collected.append((x, grad))
        return ctx.product.backward(grad), None, None  # (n, I)
