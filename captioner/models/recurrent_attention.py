"""The additive attention at every step of a teacher-forced recurrence (the LSTM's training step),
its gradients made here rather than by autograd, and the rows still running at each step."""

from __future__ import annotations

import threading
import weakref

import torch

from captioner.models.attention import AdditiveAttention, hidden_layer
from captioner.models.products import plain


def row_prefixes(x: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, ...]:
    """x[:n] for each n of `sizes` (non-increasing), whose backward fills one gradient, not one per prefix."""
    if len(sizes) == 1 and sizes[0] == x.shape[0]:
        return (x,)
    return _RowPrefixes.apply(x, tuple(sizes))


class _RowPrefixes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, sizes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        ctx.sizes, ctx.shape = sizes, x.shape
        ctx.set_materialize_grads(False)  # a prefix no step used passes no gradient: no zeros made for it
        return tuple(x[:n] for n in sizes)  # views, (n, ...) each

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, None]:  # type: ignore[override]
        used = [(n, g) for n, g in zip(ctx.sizes, grads) if g is not None]
        if not used:
            return None, None
        grad = used[0][1].new_zeros(ctx.shape)  # (B, ...)
        for n, g in used:
            grad[:n] += g
        return grad, None


class RecurrentAttention:
    """`AdditiveAttention.attend` at each step t of a teacher-forced recurrence over one grid, n_t rows
    (non-increasing) at step t. With gradients, each step's hidden layer sigmoid(2(W_h h + W_s s)) is
    written into one buffer per run of equal n_t; backward turns it into g sigma' in place, and the grid's
    gradient is one sum over the steps, times w, after the last step's backward: autograd would make
    (g w) sigma' anew and add it into the grid's gradient at every step. On a GPU, under autocast, torch.compile,
    a wrapped score layer or without gradients: `attend` itself."""

    def __init__(self, attention: AdditiveAttention, projected: torch.Tensor, active: list[int]) -> None:
        self.attention = attention
        # The CPU alone, where it was measured (records bench_decoder_step): a GPU's bandwidth is another story.
        self.deferred = projected.device.type == "cpu" and torch.is_grad_enabled() and plain(attention.score) and not (
            torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling()
        )
        sizes = list(dict.fromkeys(active))  # distinct, non-increasing
        if not self.deferred:
            self.projected_for = dict(zip(sizes, row_prefixes(projected, sizes)))  # n -> (n, N, A)
            return
        self.score_weight, self.score_bias = attention.score_terms()  # (A,), (1,)
        # The graph holds the layers, they hold no part of it: freed with the graph, no cycle for gc.
        self.layers = _HiddenLayers(attention, projected, active, self.score_weight.detach())
        self.grid = _SharedGrid.apply(projected, self.layers)  # (B, N, A); its backward sums the steps' gradients

    def __call__(self, t: int, feats: torch.Tensor, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step t: feats (n_t, N, D), query W_s s_{t-1} + b_s (n_t, A) -> context (n_t, D), weights (n_t, N)."""
        if not self.deferred:
            return self.attention.attend(feats, self.projected_for[query.shape[0]], query)
        scores = _StepScores.apply(self.grid, query, self.score_weight, self.layers, t)  # (n, N)
        weights = (scores + self.score_bias).softmax(dim=-1)  # (n, N): a_tij
        return torch.bmm(weights.unsqueeze(1), feats).squeeze(1), weights  # (n, D), (n, N)


# A CPU buffer of hidden layers kept, per attention module, from one training step for the next: a few
# hundred MB, which glibc maps anew each step (its default mmap threshold tops out at 32 MB; the command
# line's, captioner.core.allocator, at 256 MB, and a library user keeps glibc's) and the kernel then faults
# in page by page, ~90k faults a step at the tutorial's sizes. Weak keys: it goes with its module.
_SPARE: weakref.WeakKeyDictionary[AdditiveAttention, torch.Tensor] = weakref.WeakKeyDictionary()
_SPARE_LOCK = threading.Lock()


def _take_buffer(owner: AdditiveAttention, numel: int, like: torch.Tensor) -> torch.Tensor:
    """A flat buffer of at least `numel` elements of `like`'s dtype, the owner's spare if it fits."""
    with _SPARE_LOCK:
        spare = _SPARE.pop(owner, None)
    if spare is not None and spare.numel() >= numel and spare.dtype == like.dtype:
        return spare
    return like.new_empty(numel)


def _give_back(owner: weakref.ref[AdditiveAttention], held: list[torch.Tensor]) -> None:
    """The buffer in `held` becomes its owner's spare, once (backward's end and garbage collection both call)."""
    module = owner()
    if not held or module is None:
        held.clear()
        return
    buffer = held.pop()
    with _SPARE_LOCK:
        kept = _SPARE.get(module)
        if kept is None or kept.numel() <= buffer.numel():
            _SPARE[module] = buffer


class _HiddenLayers:
    """The steps' hidden layers, one (end - start, n, N, A) buffer per run of steps [start, end) with n rows,
    cut from one flat buffer; after a step's backward its slot holds g sigma' (`turned`) until the grid's
    gradient sums it (`pending`), which hands the flat buffer back for the next step."""

    def __init__(self, owner: AdditiveAttention, projected: torch.Tensor, active: list[int],
                 score_weight: torch.Tensor) -> None:
        self.rows, self.steps, self.score_weight = projected.shape[0], len(active), score_weight  # weight (A,)
        self.spans = [(active.index(n), len(active) - active[::-1].index(n), n) for n in dict.fromkeys(active)]
        self.shape, self.like = projected.shape[1:], projected.detach()  # (N, A)
        self.owner = weakref.ref(owner)
        self.held: list[torch.Tensor] = []  # the flat buffer, while this holds it
        self.runs = self._cut(_take_buffer(owner, self._numel(), projected))
        weakref.finalize(self, _give_back, self.owner, self.held)  # a graph freed without backward
        self.turned: set[int] = set()  # slots holding g sigma' rather than sigma
        self.pending: set[int] = set()  # turned since the grid's gradient was last summed

    def _numel(self) -> int:
        return sum((end - start) * n for start, end, n in self.spans) * self.shape.numel()

    def _cut(self, flat: torch.Tensor) -> list[tuple[int, int, torch.Tensor]]:
        self.held[:] = [flat]
        runs, offset = [], 0
        for start, end, n in self.spans:
            size = (end - start) * n * self.shape.numel()
            runs.append((start, end, flat[offset : offset + size].view(end - start, n, *self.shape)))
            offset += size
        return runs

    def slot(self, t: int) -> torch.Tensor:
        """Step t's (n_t, N, A) part of its run's buffer; after the buffer went back, a new one's."""
        if not self.held:  # a second backward of the graph (retain_graph) after the first handed it back
            self.runs = self._cut(self.like.new_empty(self._numel()))
            self.turned = set(range(self.steps))  # nothing in it: each step makes its hidden layer again
        for start, end, buffer in self.runs:
            if start <= t < end:
                return buffer[t - start]
        raise IndexError(f"step {t} is past the {self.steps} steps")

    def grid_gradient(self) -> torch.Tensor | None:
        """The grid's gradient (B, N, A), w sum_t g_t sigma'_t over the steps turned since the last call."""
        grad = None
        for start, end, buffer in self.runs:
            done = [t - start for t in range(start, end) if t in self.pending]
            if not done:
                continue
            part = buffer.sum(0) if len(done) == end - start else buffer[done].sum(0)  # (n, N, A)
            if grad is None:
                grad = part
            else:
                grad[: part.shape[0]] += part
        self.pending.clear()
        _give_back(self.owner, self.held)  # the slots are read: the next step's forward may have them
        if grad is None:
            return None
        grad.mul_(self.score_weight)  # (n_0, N, A)
        missing = self.rows - grad.shape[0]  # rows no step had
        return torch.cat([grad, grad.new_zeros(missing, *grad.shape[1:])]) if missing else grad  # (B, N, A)


class _SharedGrid(torch.autograd.Function):
    """The projected grid as every step sees it; its backward, after theirs, sums what they left."""

    @staticmethod
    def forward(ctx, projected: torch.Tensor, layers: _HiddenLayers) -> torch.Tensor:  # type: ignore[override]
        ctx.layers = layers
        ctx.set_materialize_grads(False)  # the steps pass it no gradient: no zero grid is made for it
        return projected.view_as(projected)  # (B, N, A)

    @staticmethod
    def backward(ctx, _unused: torch.Tensor | None) -> tuple[torch.Tensor | None, None]:  # type: ignore[override]
        return ctx.layers.grid_gradient(), None


class _StepScores(torch.autograd.Function):
    """e_t - b' = 2 w^T sigmoid(grid + 2 query) for one step, the hidden layer kept in the step's slot;
    backward: w's and the query's gradients, and g sigma' left in the slot for the grid's."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, grid: torch.Tensor, query: torch.Tensor, score_weight: torch.Tensor, layers: _HiddenLayers, t: int
    ) -> torch.Tensor:
        hidden = hidden_layer(grid[: query.shape[0]], query, out=layers.slot(t))  # (n, N, A): `attend`'s numbers
        ctx.save_for_backward(grid, query, score_weight)
        ctx.layers, ctx.t = layers, t
        return torch.matmul(hidden, score_weight)  # (n, N)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx, grad: torch.Tensor
    ) -> tuple[None, torch.Tensor, torch.Tensor | None, None, None]:
        grid, query, score_weight = ctx.saved_tensors
        layers, t = ctx.layers, ctx.t
        hidden = layers.slot(t)  # (n, N, A)
        if t in layers.turned:  # a second backward of the graph (retain_graph): make the hidden layer again
            hidden_layer(grid[: hidden.shape[0]], query, out=hidden)  # (n, N, A)
            layers.turned.discard(t)
        grad_weight = None
        if ctx.needs_input_grad[2]:
            grad_weight = torch.bmm(grad.unsqueeze(1), hidden).sum(0).squeeze(0)  # (A,): sum_ij g_ij sigma_ij
        # g sigma'(.) without w, in place of sigma: w multiplies the query's gradient here, the grid's once.
        torch.ops.aten.sigmoid_backward.grad_input(grad.unsqueeze(-1).expand_as(hidden), hidden, grad_input=hidden)
        layers.turned.add(t)
        layers.pending.add(t)
        grad_query = hidden.sum(1) * (2 * score_weight)  # (n, A): the doubled query's
        return None, grad_query, grad_weight, None, None
