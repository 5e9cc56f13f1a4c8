"""Training on several processes with torchrun and DistributedDataParallel.

`setup` joins torchrun's processes into one group (NCCL on CUDA, gloo on CPU); without torchrun every
collective here is a no-op. Only rank 0 writes files. A failing rank leaves at once (`abort`) rather than
leave the others waiting in a collective; torchrun then stops them."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from captioner.core.errors import CaptionerError, ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Distributed:
    device: torch.device
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    host_group: Any = None  # gloo group for CPU collectives (the default group when it is gloo)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier(group=self.host_group)

    def sum_host(self, values: list[int]) -> list[int]:
        """Element-wise sum of `values` over ranks, computed on the CPU (no device sync)."""
        if not self.enabled:
            return values
        total = torch.tensor(values, dtype=torch.int64)  # (len(values),)
        dist.all_reduce(total, group=self.host_group)
        return total.tolist()

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place sum of a device tensor over ranks."""
        if self.enabled:
            dist.all_reduce(tensor)
        return tensor

    def average_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Average the gradients over ranks in one flat all-reduce, for a step DDP's reducer never saw
        (SCST samples through the bare decoder). A missing gradient counts as zero, so every rank
        reduces the same buffer."""
        if not self.enabled:
            return
        params = [p for p in parameters if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])  # (total,)
        dist.all_reduce(flat)
        flat /= self.world_size
        for p, grad in zip(params, flat.split([p.numel() for p in params])):
            p.grad = grad.view_as(p)  # views of the one reduced buffer, as DDP's buckets

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.enabled:
            return [obj]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj, group=self.host_group)
        return gathered

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.enabled:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, group=self.host_group)
        return box[0]

    def agree(self, problem: CaptionerError | None) -> None:
        """Stop every rank with rank 0's refusal (`problem`: this rank's, or None), as `together` marks it; a
        refusal of another rank's alone is raised by that rank (rank 0 then learns of it in its next collective)."""
        decided = self.broadcast(problem)
        if decided is not None:
            raise self.together(decided)
        if problem is not None:
            raise problem

    def together(self, error: CaptionerError) -> CaptionerError:
        """`error`, marked as raised alike by every rank: rank 0 alone prints it (`says_refusal`), and no rank
        leaves before it has (`leave_after_refusal`)."""
        setattr(error, TOGETHER, self)
        return error

    def shard(self, items: list) -> list:
        """This rank's share of `items` (every world_size-th, from its rank)."""
        return items[self.rank :: self.world_size]


TOGETHER = "raised_by_every_rank"  # the attribute `Distributed.together` marks a refusal with


def says_refusal(error: BaseException) -> bool:
    """Whether this rank prints `error`: a refusal of its own, or as rank 0 one every rank raised alike."""
    ctx = getattr(error, TOGETHER, None)
    return ctx is None or ctx.is_main


def leave_after_refusal(error: BaseException) -> NoReturn:
    """Exit 2 on a refusal. One every rank raised alike waits for them all first, so rank 0 has printed it before
    any rank leaves (torchrun stops the others as one leaves): the user reads its one line, once."""
    ctx = getattr(error, TOGETHER, None)
    if ctx is not None:
        with contextlib.suppress(Exception):  # a rank gone meanwhile: this one leaves as well
            ctx.barrier()
    abort(2)


def launched() -> bool:
    """Whether torchrun (or another launcher) started this process as one of several."""
    return _env_int("WORLD_SIZE", 1) > 1


def is_main_process() -> bool:
    """Rank 0 of a torchrun job, or a process started on its own."""
    return _env_int("RANK", 0) == 0


def rank_prefix() -> str:
    return f"rank {_env_int('RANK', 0)}: " if launched() else ""


def setup(device: torch.device, timeout_minutes: float) -> Distributed:
    """Join the process group torchrun's environment describes; one process: no group at all. On CUDA
    each process takes the GPU of its LOCAL_RANK (NCCL), with a gloo group beside it for CPU collectives."""
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size <= 1:
        return Distributed(device)
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    timeout = timedelta(minutes=timeout_minutes)
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(f"LOCAL_RANK {local_rank}: this machine has {torch.cuda.device_count()} GPUs "
                              "(torchrun --nproc_per_node must not exceed them)")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
        host_group = dist.new_group(backend="gloo", timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
        host_group = dist.group.WORLD
    log.debug("rank %d of %d on %s (%s)", rank, world_size, device, dist.get_backend())
    return Distributed(device, rank, world_size, local_rank, host_group)


def shutdown(ctx: Distributed) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()


def abort(code: int) -> NoReturn:
    """Leave this rank now: no atexit handlers or process-group teardown that could wait on a
    peer that is gone or stuck. torchrun sees the exit code and stops the other ranks."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def peer_failed(error: BaseException) -> bool:
    """Whether `error` is this rank's collective failing because another rank went away."""
    signs = ("Connection closed by peer", "Connection reset by peer", "remote worker", "NCCL")
    return isinstance(error, dist.DistError) or any(sign in str(error) for sign in signs)


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"environment variable {name}={text!r} is not an integer (set by torchrun)") from None
