"""Count what a piece of work asks of the machine, op by op, as it runs: the FLOPs of its products
and convolutions and the bytes each op reads and writes. `torch.utils.flop_counter` alone misses
the routes this project takes on the CPU (oneDNN's `mkldnn::_linear_pointwise`, matrix-vector
products with or without a bias), so they are taught here; `lstm_step_flops` is the hand count
the counter is checked by."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry


def _linear_pointwise_flops(x: torch.Tensor, out: torch.Tensor) -> int:
    """oneDNN's inner product: x (..., K) @ W^T (K, N) -> out (..., N), a multiply and an add each."""
    return 2 * x.numel() * out.shape[-1]


def _flops(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: object) -> int:
    packet = func._overloadpacket
    if packet is torch.ops.aten.mv:  # (M, K) @ (K,)
        return 2 * args[0].numel()
    if packet is torch.ops.aten.dot:  # (K,) . (K,)
        return 2 * args[0].numel()
    if packet is torch.ops.aten.addmv:  # bias + (M, K) @ (K,)
        return 2 * args[1].numel()
    if getattr(torch.ops, "mkldnn", None) is not None and packet is torch.ops.mkldnn._linear_pointwise:
        return _linear_pointwise_flops(args[0], out)  # type: ignore[arg-type]
    formula = flop_registry.get(packet)
    return int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0


def _nbytes(t: torch.Tensor) -> int:
    """The bytes a tensor spans: its elements, or its storage where it is smaller (an expanded view)."""
    size = t.numel() * t.element_size()
    if t.layout == torch.strided and not t.is_mkldnn:
        size = min(size, t.untyped_storage().nbytes())
    return size


def _tensors(value: object) -> list[torch.Tensor]:
    return [v for v in tree_flatten(value)[0] if isinstance(v, torch.Tensor)]


@dataclass
class OpCount:
    """One op's FLOPs and bytes (reads plus writes), named by its overload."""

    name: str
    flops: int
    bytes: int


@dataclass
class OpCounter(TorchDispatchMode):
    """Within it, every op that runs (autograd's backward and the optimizer's included) is counted:
    FLOPs of products and convolutions (elementwise work is not counted, as is usual), and bytes as if
    each op read its inputs and wrote its outputs once to memory (views move nothing)."""

    ops: list[OpCount] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()

    @property
    def flops(self) -> int:
        return sum(op.flops for op in self.ops)

    @property
    def bytes(self) -> int:
        return sum(op.bytes for op in self.ops)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema = func._schema
        returns_alias = [r.alias_info for r in schema.returns]
        if returns_alias and all(a is not None and not a.is_write for a in returns_alias):
            self.ops.append(OpCount(str(func), 0, 0))  # a view: no data moves
            return out
        read = sum(_nbytes(t) for t in _tensors((args, kwargs)))
        written = sum(_nbytes(t) for t, a in zip(_tensors(out), returns_alias) if a is None)
        for argument, value in zip(schema.arguments, args):  # in place: the mutated inputs written back
            if argument.alias_info is not None and argument.alias_info.is_write:
                written += sum(_nbytes(t) for t in _tensors(value))
        self.ops.append(OpCount(str(func), _flops(func, args, kwargs, out), read + written))
        return out


def flops_of(run: Callable[[], object]) -> int:
    """The FLOPs of one call of `run`, counted as it runs (warm it up first where a first call differs)."""
    with OpCounter() as counter:
        run()
    return counter.flops


def lstm_step_flops(images: int, captions: int, steps: int, cells: int, feat_dim: int, attention_dim: int,
                    hidden: int, embed: int, vocab: int) -> int:
    """The LSTM decoder's training step counted by hand from its equations (`models/decoders/lstm.py`),
    every caption `steps` words long, the features fixed (stored). Forward products: W_h over the grid
    once per image; h_0 and c_0 from the mean feature; the embedding's share of the cell input for every
    word; at each step the products of h_{t-1} (W_s, f_beta, W_hh), the scores w^T tanh(.) over the
    cells, the context sum_ij a_ij h_ij and the context's share of the cell input; the deep output
    (L_h, L_z, L_o) for every word. Backward: two products of the forward's size where both operands
    learn, one where one operand is fixed (the features, their mean) or its gradient is elementwise
    (an outer product: the scores' input)."""
    B, C, T, N, D, A, H, E, V = images, captions, steps, cells, feat_dim, attention_dim, hidden, embed, vocab
    grid_projection = 2 * B * N * D * A
    initial_state = 2 * 2 * B * D * H
    embedded_input = 2 * C * T * E * 4 * H
    state_products = 2 * C * H * (A + D + 4 * H)  # each step
    scores, context = 2 * C * N * A, 2 * C * N * D  # each step
    context_input = 2 * C * D * 4 * H  # each step
    deep_output = 2 * C * T * (H * E + D * E + E * V)
    learnt_both = embedded_input + T * (state_products + context_input) + deep_output  # forward + 2 backward
    one_learnt = grid_projection + initial_state + T * (scores + context)  # forward + 1 backward
    return 3 * learnt_both + 2 * one_learnt
