"""Dense layers' fp32 matrix products on the CPU through oneDNN, 2.0-2.6x faster where MKL misses its fast
path (`python -m benchmarks products`), in another summation order (about 1e-6 relative). Taken where a
first-use check passes and a kept measurement shows a 5% win (`CAPTIONER_ONEDNN=1`: always, `=0`: never)."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

_MKLDNN = getattr(torch.ops, "mkldnn", None)
_REORDER: Callable[..., torch.Tensor] | None = getattr(_MKLDNN, "_reorder_linear_weight", None)
_INNER_PRODUCT: Callable[..., torch.Tensor] | None = getattr(_MKLDNN, "_linear_pointwise", None)


def onednn_enabled() -> bool:
    """Whether this torch build has oneDNN's inner product and `CAPTIONER_ONEDNN` does not turn it off."""
    return (_REORDER is not None and _INNER_PRODUCT is not None and torch.backends.mkldnn.is_available()
            and os.environ.get("CAPTIONER_ONEDNN", "") != "0")


_ENABLED = onednn_enabled()
_CHECKED = False  # whether the route has passed (or failed) its first-use check in this process


def set_onednn(enabled: bool) -> None:
    """Turn the oneDNN route on or off for this process, skipping the first-use check and measurement."""
    global _ENABLED, _CHECKED
    _ENABLED, _CHECKED = enabled and onednn_enabled(), True


def _route_works() -> bool:
    """At the first product: one small product checked against `F.linear`, then the speed."""
    global _ENABLED, _CHECKED
    if _CHECKED:
        return _ENABLED
    _CHECKED = True
    if problem := _op_problem():
        log.warning("products: oneDNN's inner product %s at its first use; dense layers use F.linear", problem)
    # CAPTIONER_ONEDNN=1: the route without measuring
    _ENABLED = not problem and (os.environ.get("CAPTIONER_ONEDNN", "") == "1" or faster_here())
    return _ENABLED


def _op_problem() -> str:
    """'' when one small product through oneDNN equals `F.linear`'s; else what went wrong."""
    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (
        torch.randn(*shape, generator=generator) for shape in ((3, 16), (5, 16), (5,))
    )  # (3, 16), (5, 16), (5,)
    try:
        with torch.no_grad():
            got = _product(x, _reorder(weight), bias)  # (3, 5)
        ok = isinstance(got, torch.Tensor) and got.shape == (3, 5) and torch.allclose(
            got, F.linear(x, weight, bias), atol=1e-4, rtol=1e-4
        )
        return "gave other numbers than F.linear" if not ok else ""
    except Exception as e:  # a private op: missing, renamed, of another signature
        return f"failed ({type(e).__name__}: {' '.join(str(e).split())[:120]})"


def route_taken() -> bool:
    """Whether this process's fp32 CPU products go through oneDNN (decided now if not yet): a checkpoint records it."""
    return _ENABLED and _route_works()


def take_route(onednn: bool, source: str) -> None:
    """Take the route the run `source` was trained with (unless `CAPTIONER_ONEDNN` is set): bit for bit."""
    global _ENABLED, _CHECKED
    if os.environ.get("CAPTIONER_ONEDNN", "") in ("0", "1") or (_CHECKED and _ENABLED == onednn):
        return
    if onednn and (problem := _op_problem() if onednn_enabled() else "is not in this torch build"):
        log.warning("products: %s was trained with oneDNN's products, but here oneDNN's inner product %s: "
                    "it goes on with F.linear, not bit for bit", source, problem)
        _ENABLED, _CHECKED = False, True  # checked: its first product does not check and warn again
        return
    # The local choice: this process's route if a product has asked, else the machine's kept decision.
    known = _ENABLED if _CHECKED else _kept_decision()
    _ENABLED, _CHECKED = onednn, True
    if known is not None and known != onednn:
        log.info("products: %s, the route %s was trained with (this machine alone would take the other)",
                 "oneDNN" if onednn else "F.linear", source)


CALIBRATION = "onednn_products"  # the decision's name in the machine cache
SHAPE = (160, 512, 2048)  # rows, in, out: an LSTM step's products over a batch of 32 images x 5 captions


def time_both(rounds: int = 3, repeats: int = 5) -> tuple[float, float]:
    """The fastest of `rounds` x `repeats` products of SHAPE, interleaved: (oneDNN s, F.linear s)."""
    import time

    rows, k, n = SHAPE
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(rows, k, generator=generator), torch.randn(n, k, generator=generator)  # (rows, k), (n, k)
    best = [float("inf"), float("inf")]
    with torch.no_grad():
        packed = _reorder(weight)
        for _ in range(rounds):
            for i, product in enumerate((lambda: _product(x, packed, None), lambda: F.linear(x, weight))):
                product()  # warm
                start = time.perf_counter()
                for _ in range(repeats):
                    product()
                best[i] = min(best[i], (time.perf_counter() - start) / repeats)
    return best[0], best[1]


def measure_route() -> dict:
    """Both routes timed here: {"onednn": whether it wins by 5%, "onednn_ms", "linear_ms"}."""
    onednn, f_linear = time_both()
    return {"onednn": onednn < 0.95 * f_linear, "onednn_ms": round(onednn * 1e3, 3),
            "linear_ms": round(f_linear * 1e3, 3)}


def _valid_decision(known: object) -> bool:
    return isinstance(known, dict) and isinstance(known.get("onednn"), bool)


def _kept_decision() -> bool | None:
    """The route the machine cache keeps, without measuring; None when it keeps none."""
    from captioner.core import machine_cache

    known = machine_cache.recall(CALIBRATION)
    return known["onednn"] if _valid_decision(known) else None


def faster_here() -> bool:
    """Whether the route beats F.linear by 5% on this processor: recalled, else measured once and kept."""
    from captioner.core import machine_cache

    decision, measured = machine_cache.decided(CALIBRATION, measure_route, _valid_decision)
    if measured:
        log.debug(
            "products: a %dx%d by %dx%d product took %.2f ms through oneDNN, "
            "%.2f ms through F.linear on this CPU: %s",
            SHAPE[0], SHAPE[1], SHAPE[1], SHAPE[2], decision["onednn_ms"], decision["linear_ms"],
            "the oneDNN route" if decision["onednn"] else "F.linear",
        )
    return decision["onednn"]


def _applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        _ENABLED and torch.backends.mkldnn.enabled  # a user who turned oneDNN off gets none of it
        and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
        and not weight.is_mkldnn and not torch.is_autocast_enabled("cpu") and not torch.jit.is_tracing()
        and not torch.onnx.is_in_onnx_export() and not torch.compiler.is_compiling()
        and not torch.compiler.is_exporting() and _route_works()
    )


def _product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., K) @ W^T + bias -> (..., N), W (N, K) reordered by `_reorder`."""
    return _INNER_PRODUCT(x, packed, bias, "none", [], "")  # type: ignore[misc]


def _reorder(weight: torch.Tensor) -> torch.Tensor:
    """weight (N, K), any strides -> oneDNN's blocked copy of it."""
    return _REORDER(weight.contiguous())  # type: ignore[misc]


# The weights reordered in the current `reused_weights` scope: id(weight) -> (weight, its copy).
# Holding the weight keeps its id from being reused by another tensor while the scope lasts.
_SCOPE: ContextVar[dict[int, tuple[torch.Tensor, torch.Tensor]] | None] = ContextVar(
    "captioner_reordered", default=None
)


@contextmanager
def reused_weights() -> Iterator[None]:
    """Within it, products without gradients reorder each weight once: for a decoding loop."""
    token = None if _SCOPE.get() is not None else _SCOPE.set({})
    try:
        yield
    finally:
        if token is not None:
            _SCOPE.reset(token)


def _scoped_reorder(weight: torch.Tensor) -> torch.Tensor:
    scope = _SCOPE.get()
    if scope is None:
        return _reorder(weight.detach())
    entry = scope.get(id(weight))
    if entry is None or entry[0] is not weight:
        entry = scope[id(weight)] = (weight, _reorder(weight.detach()))
    return entry[1]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`: x (..., K), weight (N, K), bias (N,) -> (..., N)."""
    if not _applies(x, weight):
        return F.linear(x, weight, bias)
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    if needs_grad:
        return _Linear.apply(x, weight, bias)
    return _product(x, _scoped_reorder(weight), None if bias is None else bias.detach())


def onednn_linear(layer: nn.Linear) -> nn.Linear:
    """`layer` itself, its forward now `linear`: still exactly an `nn.Linear` (keys, hooks, quantize_dynamic)."""
    layer.forward = functools.partial(_linear_forward, layer)  # a partial: copies and pickles bind their own layer
    return layer


def _linear_forward(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, layer.weight, layer.bias)


def plain(layer: nn.Module) -> bool:
    """Whether `layer` is a plain `nn.Linear`, so a fused product may read its weight."""
    from torch.nn.modules import module as torch_module

    return type(layer) is nn.Linear and not (
        layer._forward_hooks or layer._forward_pre_hooks or layer._backward_hooks or layer._backward_pre_hooks
        or torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks
        or torch_module._global_backward_hooks or torch_module._global_backward_pre_hooks
    )


def prepared(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """x (n, K) -> x @ weight^T (n, N), the weight (N, K) reordered once; no gradients flow through it."""
    if not _applies(weight, weight):
        return lambda x: x @ weight.t()
    packed = _reorder(weight.detach())
    return lambda x: _product(x, packed, None)


def gram(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a^T b: a (M, P), b (M, Q) -> (P, Q), summed over the M rows (a weight's gradient)."""
    if not _applies(a, b):
        return a.t() @ b
    if b.shape[1] <= a.shape[1]:
        return _product(a.t(), _reorder(b.t()), None)  # (P, Q): a^T (b^T)^T
    return _product(b.t(), _reorder(a.t()), None).t()  # (P, Q): (b^T a)^T


class _Linear(torch.autograd.Function):
    """`F.linear` with gradients, every product through oneDNN: x W^T; backward g W and g^T x."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        # In a decoding loop with gradients (SCST's samples) the weight is reordered once for all steps.
        return _product(x, _scoped_reorder(weight), bias)  # (..., N)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        needs_x, needs_w, needs_b = ctx.needs_input_grad
        N, K = weight.shape
        g = grad.reshape(-1, N)  # (M, N)
        grad_x = grad_w = grad_b = None
        if needs_x:
            grad_x = _product(g, _reorder(weight.t()), None).view(*x.shape[:-1], K)  # (..., K): g W
        if needs_w:
            grad_w = gram(g, x.reshape(-1, K))  # (N, K): g^T x
        if needs_b and ctx.has_bias:
            grad_b = g.sum(0)  # (N,)
        return grad_x, grad_w, grad_b
