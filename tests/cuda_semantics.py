"""CUDA's rules on a CPU-only machine: what a first GPU step would hit, found before it runs.

Two layers, each catching what the other cannot:

`cuda_autocast()`: CPU autocast made to follow CUDA's dtype policy, on real tensors. For every
op that CPU or CUDA autocast treats specially, an AutocastCPU kernel is registered for the
duration that applies CUDA's policy instead (matmuls and linear layers in bf16; softmax,
log_softmax, sum, cumsum, layer_norm, exp, log, pow, upsampling and the losses in float32; only
CUDA's short promote list widened). CUDA's lists are read from the installed torch's own
`ATen/autocast_mode.h` (the macros its CUDA registrations expand), and the set of ops CPU
autocast touches from the live dispatcher, so nothing is transcribed by hand. Everything else
runs in its inputs' dtypes, and the CPU kernels then refuse what the CUDA kernels refuse: an
`index_copy` of float32 attention into a bf16 buffer raises here as it does on a GPU, where CPU
autocast would have promoted it silently. Values are real, so backward, beam search and
host-side bookkeeping run as they do on a GPU.

`fake_cuda()`: torch's FakeTensorMode with tensors on device "cuda" and CUDA autocast switched
on. The ops run through the real AutocastCUDA kernels and CUDA's device checks on tensors
without data: a CPU tensor mixed into a device op raises, and so does any read of a device
value (`.item()`, `bool(t.all())`, `.tolist()`, a boolean mask) and any blocking copy from the
device to the host (`.cpu()`, `.to("cpu")`, `copy_` into a host tensor), which is how a step
proves it never makes the host wait. Fake kernels skip some dtype checks (index_copy's among
them), which is what the first layer is for; and the autograd engine needs a real GPU for
backward, so this layer runs forward passes.

`fake_cuda(values=True)`: the same, for code that reads the device by design (beam search keeps
its hypotheses on the host). Every device tensor also has its values, computed op by op on the
CPU beside the fake op, so each read returns what a GPU would; the reads are recorded in
`mode.device_reads` instead of raising, for the test to count.

`op_dtypes()` records the dtype of every op's output, so a test can hold the two layers
together: the same forward under both gives the same dtypes op by op.
"""

from __future__ import annotations

import contextlib
import functools
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakTensorKeyDictionary

from package_frames import package_caller

M = TypeVar("M", bound=torch.nn.Module)
AUTOCAST_DTYPE = torch.bfloat16  # what train.py's autocast asks for on CUDA

# The CUDA policies, named as autocast_mode.h's list macros name them.
POLICY_MACROS = {
    "AT_FORALL_LOWER_PRECISION_FP": "lower",
    "AT_FORALL_FP32": "fp32",
    "AT_FORALL_FP32_SET_OPT_DTYPE": "fp32_set_opt_dtype",
    "AT_FORALL_PROMOTE": "promote",
}


@functools.cache  # the installed torch's lists: read once per process
def cuda_policies(header: Path | None = None) -> dict[str, str]:
    """'aten::op.overload' -> CUDA's autocast policy, parsed from torch's autocast_mode.h."""
    header = header or Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    if not header.exists():
        raise FileNotFoundError(f"{header}: torch's autocast header is missing; cannot read CUDA's autocast lists")
    text = header.read_text()
    policies: dict[str, str] = {}
    for macro, policy in POLICY_MACROS.items():
        body = re.search(rf"#define {macro}\(_\)(.*?)(?:\n\s*\n|\n#)", text, re.S)
        if body is None:
            raise ValueError(f"{header}: no {macro} list; this torch's autocast header has another layout")
        for name, overload in re.findall(r"_\((\w+)(?:,\s*(\w+))?\)", body.group(1)):
            policies[f"aten::{name}.{overload}" if overload else f"aten::{name}"] = policy
    return policies


@functools.cache
def autocast_ops(key: str) -> frozenset[str]:
    """Every aten op with a kernel of its own under `key` (AutocastCPU, AutocastCUDA)."""
    return frozenset(
        name for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
    )


def _op(name: str) -> torch._ops.OpOverload:
    base, _, overload = name[len("aten::"):].partition(".")
    return getattr(getattr(torch.ops.aten, base), overload or "default")


def _eligible(x: object) -> bool:
    """What autocast casts: a floating tensor that is not float64."""
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64


def _kernel(op: torch._ops.OpOverload, policy: str, lower: torch.dtype):
    """An AutocastCPU kernel applying CUDA's `policy` (or none; `lower` is the autocast dtype)
    and running the op below autocast."""
    below = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
    dtype_index = next((i for i, a in enumerate(op._schema.arguments) if a.name == "dtype"), None)

    def cast(args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
        convert = lambda x: x.to(dtype) if _eligible(x) else x  # noqa: E731
        return tree_map(convert, args), tree_map(convert, kwargs)

    def kernel(*args, **kwargs):
        if policy == "lower":
            args, kwargs = cast(args, kwargs, lower)
        elif policy == "fp32":
            args, kwargs = cast(args, kwargs, torch.float32)
        elif policy == "fp32_set_opt_dtype":
            first = next((x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)), None)
            given = args[dtype_index] if dtype_index is not None and len(args) > dtype_index else kwargs.get("dtype")
            if _eligible(first) and given is None and dtype_index is not None:
                args, kwargs = args[:dtype_index], {**kwargs, "dtype": torch.float32}
        elif policy == "promote":
            floats = [x.dtype for x in tree_flatten((args, kwargs))[0] if _eligible(x)]
            if floats:
                widest = floats[0]
                for d in floats[1:]:
                    widest = torch.promote_types(widest, d)
                args, kwargs = cast(args, kwargs, widest)
        with torch._C._ExcludeDispatchKeyGuard(below):
            return op(*args, **kwargs)

    return kernel


@contextlib.contextmanager
def cuda_autocast(dtype: torch.dtype = AUTOCAST_DTYPE) -> Iterator[dict[str, str]]:
    """CPU autocast with CUDA's dtype policy while inside; yields the op -> policy table in force.

    Inside, autocast is on for the CPU, as `torch.autocast("cuda", dtype)` turns it on for a GPU
    step. The kernels are removed on exit, so the rest of the process keeps CPU autocast as
    torch ships it.
    """
    cuda = cuda_policies()
    table = {name: cuda.get(name, "none") for name in autocast_ops("AutocastCPU") | set(cuda)}
    library = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel": the point
            for name, policy in table.items():
                try:
                    op = _op(name)
                except AttributeError:  # listed in the header, not built into this torch
                    continue
                library.impl(name[len("aten::"):], _kernel(op, policy, dtype), "AutocastCPU")
        with torch.autocast("cpu", dtype=dtype):
            yield table
    finally:
        library._destroy()


class DeviceRead(RuntimeError):
    """A blocking copy of a device tensor to the host under `fake_cuda()`: on a GPU the host
    would wait there for every queued kernel."""


def _on_device(t: object) -> bool:
    return isinstance(t, FakeTensor) and t.device.type == "cuda"


class _HostStaysReal(TorchDispatchMode):
    """Inside `fake_cuda`: ops on host tensors alone run for real, as on a GPU machine, where
    the lengths, indices and counters a loop keeps on the CPU have values; any op that touches a
    device tensor, or makes one, goes on to the fake mode. Pinning is accepted as a no-op (it
    needs a GPU driver and changes nothing a test can see).

    A copy from the host to the device without non_blocking=True (`torch.tensor(list,
    device=...)`, `.to(device)`) is recorded in `blocking_copies`: on CUDA it waits for the
    stream (torch.cuda.set_sync_debug_mode flags it), so a step must not make one. A copy from
    the device to the host without non_blocking=True (`.cpu()`, `.to("cpu")`, `copy_` into a
    host tensor) waits for every queued kernel: it raises `DeviceRead`, as a value read raises
    in the fake mode. (A non-blocking one is allowed: it lands in pinned memory, no wait.)

    With `values`, every device tensor made here has a shadow: a CPU tensor with its values,
    made by the same op (autocast's casts included) on the inputs' shadows. A read of a device
    value, a copy to the host and an op whose output size depends on the values (`nonzero`) then
    return the shadow's values, and each is recorded in `device_reads` (`.tolist()` once) rather
    than raising."""

    PIN_OPS = {"_pin_memory", "pin_memory", "is_pinned"}

    def __init__(self, values: bool = False) -> None:
        super().__init__()
        self.blocking_copies: list[str] = []
        self.values = values
        self.device_reads: list[str] = []
        self.shadows = WeakTensorKeyDictionary()  # fake device tensor -> a CPU tensor with its values

    def link(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        self.shadows[fake] = real

    def real(self, tree: object) -> object:
        """args or kwargs with every fake tensor replaced by its shadow and device "cuda" by the CPU."""

        def convert(x: object) -> object:
            if isinstance(x, FakeTensor):
                if x not in self.shadows:
                    raise RuntimeError(
                        "fake_cuda(values=True): a device tensor without values (made outside the mode?)")
                return self.shadows[x]
            if isinstance(x, torch.device) and x.type == "cuda":
                return torch.device("cpu")
            return x

        return tree_map(convert, tree)

    def read(self, what: str) -> None:
        entry = f"{what} at {_caller()}"
        if not self.values:
            raise DeviceRead(f"{entry}: a copy from the device to the host, which waits for the GPU")
        self.device_reads.append(entry)

    def run_real(self, func, args: tuple, kwargs: dict):
        with unset_fake_temporarily():
            return func(*self.real(args), **self.real(kwargs))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if name in self.PIN_OPS and tensors and not isinstance(tensors[0], FakeTensor):
            return False if name == "is_pinned" else tensors[0]
        device = kwargs.get("device")
        to_device = device is not None and torch.device(device).type == "cuda"
        source = tensors[-1] if name == "copy_" else tensors[0] if tensors else None
        into_device = to_device or (name == "copy_" and isinstance(tensors[0], FakeTensor))
        # copy_(dst, src, non_blocking)
        non_blocking = kwargs.get("non_blocking") or (name == "copy_" and len(args) > 2 and args[2])
        if name in ("_to_copy", "copy_") and into_device and not isinstance(source, FakeTensor) and not non_blocking:
            self.blocking_copies.append(f"{func} at {_caller()}")
        to_host = (name == "_to_copy" and _on_device(source) and device is not None and torch.device(device).type
                   == "cpu") or (
            name == "copy_" and _on_device(source) and not _on_device(tensors[0])
        )
        if to_host:
            if not non_blocking:
                self.read(str(func))
            # with values: a host tensor
            return self.run_real(func, args, kwargs) if self.values else func(*args, **kwargs)
        if not (to_device or any(isinstance(t, FakeTensor) for t in tensors)):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if not self.values:
            return func(*args, **kwargs)
        try:
            out = func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):  # a read: the shadow's values
            self.read(str(func))
            out = self.run_real(func, args, kwargs)
            if not isinstance(out, torch.Tensor):
                return out  # a number: what .item() gives
            # a fake of the read size
            fake = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device="cuda")
            self.link(fake, out)
            return fake
        fakes = [t for t in tree_flatten(out)[0] if isinstance(t, FakeTensor)]
        if fakes or func._schema.is_mutable:
            reals = tree_flatten(self.run_real(func, args, kwargs))[0]
            for f, r in zip(tree_flatten(out)[0], reals, strict=True):
                if isinstance(f, FakeTensor):
                    self.link(f, r)
        return out


@contextlib.contextmanager
def fake_cuda(dtype: torch.dtype = AUTOCAST_DTYPE, autocast: bool = True,
              values: bool = False) -> Iterator[FakeTensorMode]:
    """FakeTensorMode with CUDA autocast on (`torch.autocast("cuda")` refuses without a GPU; the
    flags it would set are set directly). Make tensors with device="cuda" and move models with
    `to_fake_cuda`; the default device stays the CPU, so code that forgets `device=` makes a
    CPU tensor here as it would on a GPU machine, and mixing it in raises. Host tensors keep
    their values; the mode's `blocking_copies` lists the host-to-device copies that would wait
    (`_HostStaysReal`). With `values`, device tensors have values too and the mode's
    `device_reads` lists every read of them, in order."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    was_enabled, was_dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    host = _HostStaysReal(values)
    mode.blocking_copies = host.blocking_copies  # type: ignore[attr-defined]  # what the test asserts on
    mode.device_reads = host.device_reads  # type: ignore[attr-defined]
    mode.host = host  # type: ignore[attr-defined]  # to_fake_cuda gives the weights their values
    tolist = FakeTensor.tolist

    def read_list(self: FakeTensor) -> object:  # one read, not one per element (FakeTensor's own tolist)
        if not (values and _on_device(self)):
            return tolist(self)
        host.read("tolist")
        return host.shadows[self].tolist()

    with mode, host:
        torch.set_autocast_enabled("cuda", autocast)
        torch.set_autocast_dtype("cuda", dtype)
        FakeTensor.tolist = read_list  # type: ignore[method-assign]
        try:
            yield mode
        finally:
            FakeTensor.tolist = tolist  # type: ignore[method-assign]
            torch.set_autocast_enabled("cuda", was_enabled)
            torch.set_autocast_dtype("cuda", was_dtype)
            torch.clear_autocast_cache()


def _caller() -> str:
    """file:line of the innermost frame of the imported package on the stack."""
    return package_caller() or "?"


def to_fake_cuda(module: M, mode: FakeTensorMode) -> M:
    """The module with every parameter and buffer replaced, in place, by a fake CUDA tensor of
    the same shape, dtype and requires_grad (`.to("cuda")` cannot swap fake tensors in). Tied
    weights stay tied."""
    converted: dict[int, torch.Tensor] = {}

    host = getattr(mode, "host", None)

    def fake(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in converted:
            on_host = mode.from_tensor(t.detach())
            if host is not None and host.values:
                host.link(on_host, t.detach())  # the weights' values follow them to the device
            converted[id(t)] = on_host.to("cuda")
        return converted[id(t)]

    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None:
                if id(p) not in converted:
                    converted[id(p)] = torch.nn.Parameter(fake(p), requires_grad=p.requires_grad)
                    if host is not None and host.values and converted[id(p)] not in host.shadows:
                        host.link(converted[id(p)], p.detach())
                sub._parameters[name] = converted[id(p)]
        for name, b in list(sub._buffers.items()):
            if b is not None:
                sub._buffers[name] = fake(b)
    return module


class op_dtypes(TorchDispatchMode):
    """Records (op, dtypes of its tensor outputs) for every op that runs below autocast.

    Casts that autocast inserts (`_to_copy`) are left out: the two layers cache casts of the
    weights differently, and what matters is the dtype each real op computes in. So are layout
    copies (`clone`, which computes in no dtype of its own): `.contiguous()` copies the encoder's
    cells where the convolutions return NCHW (CUDA) and not where they return channels-last
    (the CPU's oneDNN).
    """

    SKIPPED = {"_to_copy", "to", "detach", "alias", "lift_fresh", "empty_strided", "_pin_memory", "pin_memory",
               "is_pinned", "clone"}

    def __init__(self) -> None:
        super().__init__()
        self.trace: list[tuple[str, tuple[torch.dtype, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in self.SKIPPED and func.namespace != "prim":  # prim.device: fake tensors asked where they live
            dtypes = tuple(t.dtype for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
            self.trace.append((str(func), dtypes))
        return out
