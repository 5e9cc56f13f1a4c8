"""Checkpoints: state dicts + config + vocabulary, weights_only loading, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import tiny_model

from captioner.core.errors import CheckpointError
from captioner.models.checkpoint import load_captioner, save_checkpoint


def test_round_trip_gives_identical_outputs(tmp_path: Path) -> None:
    model = tiny_model()
    path = tmp_path / "model.pt"
    save_checkpoint(path, model, step=7)
    payload = torch.load(path, weights_only=True)  # no code can run while loading
    assert payload["step"] == 7 and payload["vocab"] == model.vocab.words
    loaded = load_captioner(path)
    images = torch.randn(2, 3, 32, 32)
    tokens = torch.randint(0, len(model.vocab), (2, 5))
    torch.testing.assert_close(loaded(images, tokens).logits, model(images, tokens).logits, rtol=0, atol=0)
    a, b = model.caption_images(images, beam_size=2), loaded.caption_images(images, beam_size=2)
    assert [c.tokens for c in a] == [c.tokens for c in b]
    assert loaded.config == model.config


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_captioner(tmp_path / "none.pt")


def test_corrupt_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="bad.pt: not a readable captioner checkpoint"):
        load_captioner(tmp_path / "bad.pt")


def test_pickled_module_is_refused(tmp_path: Path) -> None:
    """A checkpoint that pickles a whole module (the tutorial habit) would run code: refused."""
    torch.save({"model": tiny_model(), "config": {}, "vocab": []}, tmp_path / "module.pt")
    with pytest.raises(CheckpointError, match="not a readable captioner checkpoint"):
        load_captioner(tmp_path / "module.pt")


def test_not_a_captioner_checkpoint(tmp_path: Path) -> None:
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="lacks model, config or vocab"):
        load_captioner(tmp_path / "other.pt")


def test_incompatible_weights(tmp_path: Path) -> None:
    model = tiny_model()
    path = tmp_path / "model.pt"
    save_checkpoint(path, model)
    payload = torch.load(path, weights_only=True)
    payload["config"]["model"]["decoder"]["hidden_dim"] = 40  # config no longer fits the weights
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="do not fit the model"):
        load_captioner(path)
    payload["config"]["model"]["decoder"]["bogus"] = 1
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="incompatible config.*bogus"):
        load_captioner(path)
    payload["format_version"] = 99
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="format 99 is not supported"):
        load_captioner(path)
