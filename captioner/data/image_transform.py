"""The one transform from a picture to the encoder's input: a resize to uint8 (3, S, S) on the host (training
adds a crop and jitter), then the normalisation the encoder runs on the device."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image
from torch import nn

if TYPE_CHECKING:  # torchvision loads when a step needs it: a caption's transform is Pillow's alone
    from torchvision.transforms import v2

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ImageTransform:
    """Resize to a square uint8 (3, S, S) (a quarter of float's bytes to the device); training adds a mild crop
    and jitter, never a flip (captions say left and right) or a hue change (captions name colours)."""

    image_size: int
    train: bool = False
    augment: bool = False

    def __call__(self, image: Image.Image | torch.Tensor, seed: int | None = None) -> torch.Tensor:
        """A PIL picture or a uint8 (3, H, W) tensor -> uint8 (3, S, S); with a `seed`, the crop and jitter draw
        from `torch.manual_seed(seed)` and the process's RNG is left as it was."""
        if isinstance(image, Image.Image) and not (self.train and self.augment):
            return pillow_resize(image, self.image_size)  # uint8 (3, S, S): the pipeline's bytes
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            return self.pipeline()(image)

    def pipeline(self) -> v2.Compose:
        """The steps this transform runs (cached per size and augmentation)."""
        return _pipeline(self.image_size, self.train and self.augment)

    def describe(self) -> list[str]:
        """Every step from the decoded picture to the uint8 image, as the transform objects state it."""
        return [repr(step) for step in self.pipeline().transforms]


def pillow_resize(image: Image.Image, size: int) -> torch.Tensor:
    """A picture -> uint8 (C, S, S) by Pillow's bilinear resize: what the evaluation pipeline's v2.Resize and
    v2.PILToTensor make, to the byte, without importing torchvision (about a second of each command's start)."""
    return picture_tensor(image.resize((size, size), Image.Resampling.BILINEAR))  # the same size: a copy


def picture_tensor(image: Image.Image) -> torch.Tensor:
    """A picture -> its pixels as a (C, H, W) tensor, what v2.PILToTensor makes (a copy, channels a view's last)."""
    pixels = torch.from_numpy(np.array(image, copy=True))  # (H, W, C), or (H, W) for one band
    return pixels.view(image.height, image.width, len(image.getbands())).permute(2, 0, 1)  # (C, H, W)


CROP_MIN_SCALE = 0.85  # each side of the training crop keeps at least this fraction of the image's


def crop_window(height: int, width: int, min_scale: float = CROP_MIN_SCALE) -> tuple[int, int, int, int]:
    """A random window (top, left, h, w): each side min_scale..1 of the image's, so on average the photo's
    aspect (RandomResizedCrop's aspect range finds no window on a 4:3 photo), centred on average."""
    side_scales = torch.empty(2).uniform_(min_scale, 1.0)  # (2,): height, width
    h = max(1, round(height * float(side_scales[0])))
    w = max(1, round(width * float(side_scales[1])))
    top = int(torch.randint(height - h + 1, ()))
    left = int(torch.randint(width - w + 1, ()))
    return top, left, h, w


@dataclass(frozen=True)
class RandomWindowCrop:
    """Crop a `crop_window` and squash it to (size, size): on average the geometry evaluation sees."""

    size: int
    min_scale: float = CROP_MIN_SCALE

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        from torchvision.transforms import v2

        top, left, h, w = crop_window(*image.shape[-2:], self.min_scale)
        return v2.functional.resized_crop(image, top, left, h, w, [self.size, self.size], antialias=True)  # (3, S, S)


@functools.lru_cache(maxsize=None)
def _pipeline(image_size: int, augment: bool) -> v2.Compose:
    from torchvision.transforms import v2

    if augment:
        return v2.Compose([v2.PILToTensor(), RandomWindowCrop(image_size),
                           v2.ColorJitter(brightness=0.2, contrast=0.2)])
    # Pillow's own resize, so a runtime without torch (captioner.deploy) makes the same bytes; the
    # training crop stays on tensors, so the device path (data/batching) replays it exactly.
    return v2.Compose([v2.Resize((image_size, image_size), antialias=True), v2.PILToTensor()])  # uint8 (3, S, S)


@dataclass(frozen=True)
class PixelStatistics:
    """The per-channel mean and std (of pixels in [0, 1]) a backbone's weights were trained with."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def tensors(self, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """mean and std as (3, 1, 1) float32 tensors on `device`."""
        mean = torch.tensor(self.mean, dtype=torch.float32, device=device).view(3, 1, 1)  # (3, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=device).view(3, 1, 1)  # (3, 1, 1)
        return mean, std

    def describe(self) -> list[str]:
        """The steps `normalize_images` runs, as the torchvision transforms that compute the same bits."""
        from torchvision.transforms import v2

        return [repr(v2.ToDtype(torch.float32, scale=True)), repr(v2.Normalize(list(self.mean), list(self.std)))]


IMAGENET = PixelStatistics(IMAGENET_MEAN, IMAGENET_STD)


class PixelNormalization(nn.Module):
    """uint8 images -> float32 normalised with `statistics`; non-persistent buffers (in no state dict)."""

    def __init__(self, statistics: PixelStatistics) -> None:
        super().__init__()
        self.statistics = statistics
        mean, std = statistics.tensors()
        self.register_buffer("mean", mean, persistent=False)  # (3, 1, 1)
        self.register_buffer("std", std, persistent=False)  # (3, 1, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (..., 3, H, W) -> float32 (..., 3, H, W)."""
        return normalize_images(images, self.mean, self.std)

    def describe(self) -> list[str]:
        return self.statistics.describe()

    def extra_repr(self) -> str:
        return f"mean={list(self.statistics.mean)}, std={list(self.statistics.std)}"


def normalize_images(images: torch.Tensor, mean: torch.Tensor | None = None,
                     std: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 images -> float32 (x * (1/255) - mean) / std (ImageNet's by default), as torchvision's to the bit."""
    if images.dtype != torch.uint8:
        raise TypeError(f"normalize_images: expected uint8 images, got {images.dtype}")
    if mean is None or std is None:
        mean, std = IMAGENET.tensors(images.device)
    scaled = images.to(torch.float32).mul_(1.0 / 255)  # (..., 3, H, W): v2.ToDtype(scale=True)
    return scaled.sub(mean).div_(std)  # (..., 3, H, W): v2.Normalize
