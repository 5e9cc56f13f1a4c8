"""Tiny models and data for unit tests."""

from __future__ import annotations

import importlib.util
import os

import pytest

from captioner.config import Config, load_config
from captioner.models import Captioner, build_model
from captioner.vocab import Vocabulary

WORDS = "a small large red blue green circle square star left right of above below".split()


def tiny_vocab() -> Vocabulary:
    return Vocabulary.build([" ".join(WORDS)])


def tiny_config(*overrides: str) -> Config:
    return load_config(
        None,
        [
            "data.image_size=32",
            "model.encoder.width=8",
            "model.decoder.embed_dim=16",
            "model.decoder.hidden_dim=24",
            "model.decoder.attention_dim=12",
            "model.decoder.d_model=16",
            "model.decoder.num_heads=2",
            "model.decoder.ff_dim=32",
            "model.decoder.dropout=0.1",
            *overrides,
        ],
    )


def tiny_model(*overrides: str, seed: int = 0) -> Captioner:
    import torch

    torch.manual_seed(seed)
    return build_model(tiny_config(*overrides), tiny_vocab()).eval()


IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require(available: bool, reason: str) -> None:
    """Skip the calling test when something it needs is missing, except in CI (CI=true), where a
    skip would let a green run hide that the test never ran: there it fails."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"CI=true and a test's requirement is missing: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, reason: str) -> None:
    require(importlib.util.find_spec(name) is not None, reason)


def best_by_enumeration(decoder, feat, words: list[int], bos: int, eos: int, max_length: int, alpha: float) -> tuple[list[int], float]:
    """The caption beam search should return when its beam holds every hypothesis: each
    sequence of `words` ended by <eos> within `max_length` steps, scored by teacher forcing
    (independently of the search's cached steps) and ranked by log-probability divided by GNMT's
    ((5 + length) / 6) ** alpha. feat (N, D). Returns (tokens, score)."""
    import itertools

    import torch

    sequences = [list(s) for n in range(max_length) for s in itertools.product(words, repeat=n)]
    best: tuple[list[int], float] = ([], float("-inf"))
    with torch.no_grad():
        for tokens in sequences:
            ids = torch.tensor([bos, *tokens, eos])  # (T+2,)
            logits = decoder(feat[None], ids[None, :-1]).logits[0]  # (T+1, V)
            logprob = float(logits.float().log_softmax(-1).gather(1, ids[1:, None]).sum())
            score = logprob / ((5.0 + len(tokens)) / 6.0) ** alpha
            if score > best[1]:
                best = (tokens, score)
    return best
