"""Tiny models and data for unit tests."""

from __future__ import annotations

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
