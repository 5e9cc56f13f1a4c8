"""Random number generator states as plain data, for checkpoints that resume a run exactly.

Python's, numpy's, torch's and the current CUDA device's states as tensors, lists and ints only, so a
checkpoint holding them still loads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from captioner.core.errors import CheckpointError


def rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # this process's GPU (torchrun: LOCAL_RANK's)
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    try:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(state["torch"])
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"the checkpoint's random number generator states are malformed ({e})") from None
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
