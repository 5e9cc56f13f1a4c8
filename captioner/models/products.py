"""Dense layers' fp32 matrix products on the CPU through oneDNN, 2.0-2.6x faster where MKL misses its fast
path (`python -m benchmarks products`), in another summation order (about 1e-6 relative). Taken where a
first-use check passes and a kept measurement shows a 5% win (`CAPTIONER_ONEDNN=1`: always, `=0`: never).
On the route, a weight's gradient X^T G (`gram`) is one more choice of the same measurement: oneDNN needs
both operands transposed into copies, `torch.mm` reads them in place; the faster here is taken and recorded.
So is an input's gradient g W (`_Linear`'s backward): oneDNN needs W transposed and blocked anew each step."""

from __future__ import annotations

import functools
import logging
import os
import sys
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
_GRAM_MM = False  # on the route: weight gradients by torch.mm, measured faster here (else through oneDNN)
_GRAD_MM = False  # on the route: input gradients by torch.mm, measured faster here (else through oneDNN)


def set_onednn(enabled: bool, gram_mm: bool = False, grad_mm: bool = False) -> None:
    """Turn the oneDNN route on or off for this process (its weight gradients by torch.mm with `gram_mm`,
    its input gradients with `grad_mm`), skipping the first-use check and measurement."""
    global _ENABLED, _CHECKED, _GRAM_MM, _GRAD_MM
    _ENABLED, _CHECKED, _GRAM_MM, _GRAD_MM = enabled and onednn_enabled(), True, gram_mm, grad_mm


def _route_works() -> bool:
    """At the first product: one small product checked against `F.linear`, then the speed."""
    global _ENABLED, _CHECKED, _GRAM_MM, _GRAD_MM
    if _CHECKED:
        return _ENABLED
    _CHECKED = True
    if problem := _op_problem():
        log.warning("products: oneDNN's inner product %s at its first use; dense layers use F.linear", problem)
        _ENABLED = False
    elif os.environ.get("CAPTIONER_ONEDNN", "") == "1":  # the route without measuring, its gradients as written
        _ENABLED, _GRAM_MM, _GRAD_MM = True, False, False
    else:
        decision = decided_here()
        _ENABLED, _GRAM_MM, _GRAD_MM = decision["onednn"], decision["gram_mm"], decision["grad_mm"]
    return _ENABLED


def _op_problem() -> str:
    """'' when one small product through oneDNN equals `F.linear`'s; else what went wrong."""
    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(*shape, generator=generator) for shape in ((3, 16), (5, 16), (5,)))
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


def gram_by_mm() -> bool:
    """Whether, on the route, weight gradients are `torch.mm` products (decided with it): a checkpoint records it."""
    return route_taken() and _GRAM_MM


def grad_by_mm() -> bool:
    """Whether, on the route, input gradients are `torch.mm` products (decided with it): a checkpoint records it."""
    return route_taken() and _GRAD_MM


def take_route(onednn: bool, source: str, gram_mm: bool = False, grad_mm: bool = False) -> None:
    """Take the route the run `source` was trained with, and its weight and input gradients' products
    (`gram_mm`, `grad_mm`; a checkpoint from before a choice used oneDNN's), unless `CAPTIONER_ONEDNN` is set:
    bit for bit."""
    global _ENABLED, _CHECKED, _GRAM_MM, _GRAD_MM
    if os.environ.get("CAPTIONER_ONEDNN", "") in ("0", "1"):
        return
    if _CHECKED and _ENABLED == onednn:
        _GRAM_MM, _GRAD_MM = gram_mm, grad_mm
        return
    if onednn and (problem := _op_problem() if onednn_enabled() else "is not in this torch build"):
        log.warning("products: %s was trained with oneDNN's products, but here oneDNN's inner product %s: "
                    "it goes on with F.linear, not bit for bit", source, problem)
        _ENABLED, _CHECKED = False, True  # checked: its first product does not check and warn again
        return
    # The local choice: this process's route if a product has asked, else the machine's kept decision.
    known = _ENABLED if _CHECKED else _kept_decision()
    _ENABLED, _CHECKED, _GRAM_MM, _GRAD_MM = onednn, True, gram_mm, grad_mm
    if known is not None and known != onednn:
        log.info("products: %s, the route %s was trained with (this machine alone would take the other)",
                 "oneDNN" if onednn else "F.linear", source)


# The decision's name in the machine cache; ":2" since it is timed over SHAPES with a bias (one shape
# without a bias before: a tie under AVX2 where the models' products win by 10-85%), so it is made anew.
CALIBRATION = "onednn_products:2"
# rows, in, out, each with a bias as the models' layers have one: an LSTM step's products over 32 images x 5
# captions, and a beam step's output projection over 32 images x 3 beams to 10,000 words.
SHAPES = ((160, 512, 2048), (96, 512, 10000))
GRAM_SHAPE = (4096, 512, 512)  # rows, P, Q of X^T G: a layer's weight gradient over a grid's 16 images x 256 cells
GRAD_SHAPE = (640, 2048, 512)  # rows, out, in of g W: a layer's input gradient over 32 captions x 20 words


def _fastest(candidates: tuple[Callable[[], object], ...], rounds: int, repeats: int) -> list[float]:
    """The fastest mean of `repeats` calls of each candidate over `rounds` interleaved rounds, in seconds."""
    import time

    best = [float("inf")] * len(candidates)
    with torch.no_grad():
        for _ in range(rounds):
            for i, product in enumerate(candidates):
                product()  # warm
                start = time.perf_counter()
                for _ in range(repeats):
                    product()
                best[i] = min(best[i], (time.perf_counter() - start) / repeats)
    return best


def time_both(rounds: int = 3, repeats: int = 5) -> tuple[float, float]:
    """Each product of SHAPES both ways, interleaved, the fastest of `rounds` x `repeats`, summed over the
    shapes: (oneDNN s, F.linear s). oneDNN adds the bias in its product, F.linear in a pass of its own."""
    generator = torch.Generator().manual_seed(0)
    candidates: list[Callable[[], object]] = []
    for rows, k, n in SHAPES:
        x = torch.randn(rows, k, generator=generator)  # (rows, k)
        weight, bias = torch.randn(n, k, generator=generator), torch.randn(n, generator=generator)  # (n, k), (n,)
        packed = _reorder(weight)  # W blocked once, as a layer's weight is for its decoding loop
        candidates += [functools.partial(_product, x, packed, bias), functools.partial(F.linear, x, weight, bias)]
    best = _fastest(tuple(candidates), rounds, repeats)
    return sum(best[0::2]), sum(best[1::2])


def time_grams(rounds: int = 3, repeats: int = 3) -> tuple[float, float]:
    """X^T G of GRAM_SHAPE both ways, interleaved: (through oneDNN s, by torch.mm s)."""
    rows, p, q = GRAM_SHAPE
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(rows, p, generator=generator), torch.randn(rows, q, generator=generator)  # (M, P), (M, Q)
    onednn, mm = _fastest((lambda: _onednn_gram(a, b), lambda: torch.mm(a.t(), b)), rounds, repeats)
    return onednn, mm


def time_input_grads(rounds: int = 3, repeats: int = 3) -> tuple[float, float]:
    """g W of GRAD_SHAPE both ways, interleaved, oneDNN's with the weight's transposed blocking a step needs:
    (through oneDNN s, by torch.mm s)."""
    rows, n, k = GRAD_SHAPE
    generator = torch.Generator().manual_seed(0)
    g, weight = torch.randn(rows, n, generator=generator), torch.randn(n, k, generator=generator)  # (M, N), (N, K)
    onednn, mm = _fastest((lambda: _product(g, _reorder(weight.t()), None), lambda: g @ weight), rounds, repeats)
    return onednn, mm


def measure_route() -> dict:
    """Both routes timed here, and a weight gradient's and an input gradient's two products: {"onednn": whether
    the route wins by 5%, "gram_mm" / "grad_mm": whether torch.mm wins by 5% for weight / input gradients, and
    the times in ms}."""
    onednn, f_linear = time_both()
    gram_onednn, gram_mm = time_grams()
    grad_onednn, grad_mm = time_input_grads()
    return {"onednn": onednn < 0.95 * f_linear, "onednn_ms": round(onednn * 1e3, 3),
            "linear_ms": round(f_linear * 1e3, 3), "gram_mm": gram_mm < 0.95 * gram_onednn,
            "gram_onednn_ms": round(gram_onednn * 1e3, 3), "gram_mm_ms": round(gram_mm * 1e3, 3),
            "grad_mm": grad_mm < 0.95 * grad_onednn, "grad_onednn_ms": round(grad_onednn * 1e3, 3),
            "grad_mm_ms": round(grad_mm * 1e3, 3)}


def _valid_decision(known: object) -> bool:
    return isinstance(known, dict) and all(isinstance(known.get(key), bool) for key in ("onednn", "gram_mm", "grad_mm"))


def _kept_decision() -> bool | None:
    """The route the machine cache keeps, without measuring; None when it keeps none."""
    from captioner.core import machine_cache

    known = machine_cache.recall(CALIBRATION)
    return known["onednn"] if _valid_decision(known) else None


def decided_here() -> dict:
    """This processor's decision ({"onednn", "gram_mm"} and the times): recalled, else measured once and kept."""
    from captioner.core import machine_cache

    decision, measured = machine_cache.decided(CALIBRATION, measure_route, _valid_decision)
    if measured:
        log.debug(
            "products: %s products with a bias took %.2f ms through oneDNN, %.2f ms through F.linear; a weight "
            "gradient %.2f ms through oneDNN, %.2f ms by torch.mm; an input gradient %.2f ms through oneDNN, %.2f ms "
            "by torch.mm on this CPU: %s, weight gradients by %s, input gradients by %s",
            " and ".join(f"{m}x{k} by {k}x{n}" for m, k, n in SHAPES), decision["onednn_ms"], decision["linear_ms"],
            decision["gram_onednn_ms"], decision["gram_mm_ms"], decision["grad_onednn_ms"], decision["grad_mm_ms"],
            "the oneDNN route" if decision["onednn"] else "F.linear", "torch.mm" if decision["gram_mm"] else "oneDNN",
            "torch.mm" if decision["grad_mm"] else "oneDNN",
        )
    return decision


def faster_here() -> bool:
    """Whether the route beats F.linear by 5% on this processor: recalled, else measured once and kept."""
    return decided_here()["onednn"]


def exporting_onnx() -> bool:
    """Whether an ONNX export is under way: never while torch.onnx is unloaded (asking would load it, about 25 ms
    of a command's first caption)."""
    return "torch.onnx" in sys.modules and torch.onnx.is_in_onnx_export()


def _applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        _ENABLED and torch.backends.mkldnn.enabled  # a user who turned oneDNN off gets none of it
        and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
        and not weight.is_mkldnn and not torch.is_autocast_enabled("cpu") and not torch.jit.is_tracing()
        and not exporting_onnx() and not torch.compiler.is_compiling()
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
    if not _applies(a, b) or _GRAM_MM:
        return a.t() @ b  # (P, Q)
    return _onednn_gram(a, b)


def _onednn_gram(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a^T b through oneDNN's inner product, the narrower operand transposed as the weight."""
    if b.shape[1] <= a.shape[1]:
        return _product(a.t(), _reorder(b.t()), None)  # (P, Q): a^T (b^T)^T
    return _product(b.t(), _reorder(a.t()), None).t()  # (P, Q): (b^T a)^T


class _Linear(torch.autograd.Function):
    """`F.linear` with gradients through oneDNN: x W^T; backward g W and g^T x, each by torch.mm where decided."""

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
        if needs_x:  # g W: by torch.mm reading W in place, or through oneDNN with W^T blocked anew
            grad_x = (g @ weight if _GRAD_MM else _product(g, _reorder(weight.t()), None)).view(*x.shape[:-1], K)
        if needs_w:
            grad_w = gram(g, x.reshape(-1, K))  # (N, K): g^T x
        if needs_b and ctx.has_bias:
            grad_b = g.sum(0)  # (N,)
        return grad_x, grad_w, grad_b
