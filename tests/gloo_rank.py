"""One rank of test_distributed's gradient average: `python gloo_rank.py RANK WORLD PORT OUT`.

Started as a script (forked warm by tests/warm_start.py), it joins a gloo group on 127.0.0.1:PORT,
averages hand-made gradients with `Distributed.average_gradients` and writes what it holds after
to OUT as JSON."""

from __future__ import annotations

import json
import os
import sys

import torch

from captioner.training import distributed


def average_in_a_group(rank: int, world_size: int, port: int) -> dict:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        ctx = distributed.Distributed(rank=rank, world_size=world_size, local_rank=rank, device=torch.device("cpu"))
        a, b, frozen = (torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2)),
                        torch.nn.Parameter(torch.zeros(1), requires_grad=False))
        a.grad = torch.full((3,), float(rank + 1))  # rank 0: 1, rank 1: 2
        if rank == 1:
            b.grad = torch.full((2, 2), 4.0)  # rank 0 has none: it counts as zero
        ctx.average_gradients([a, b, frozen])
        frozen_grad = None if frozen.grad is None else frozen.grad.tolist()
        return {"a": a.grad.tolist(), "b": b.grad.tolist(), "frozen": frozen_grad}
    finally:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    rank, world_size, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    with open(out, "w") as f:
        json.dump(average_in_a_group(rank, world_size, port), f)
