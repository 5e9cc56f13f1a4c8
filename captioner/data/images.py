"""The one image loader and the one transform that training, evaluation, CLI and demo share."""

from __future__ import annotations

import functools
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torchvision.transforms import v2

from captioner.errors import ImageLoadError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# A decompression bomb guard: 50 megapixels is far above any camera photo a captioner needs and
# far below what exhausts memory when decoded (PIL's own default warns at 89 MP, errors at 179 MP).
MAX_PIXELS = 50_000_000


def load_image(source: str | Path | bytes | BinaryIO, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """Read an image file as an upright 8-bit RGB picture, or raise `ImageLoadError`.

    EXIF orientation is applied; modes L, LA, P (with transparency), RGBA, CMYK and 16-bit
    greyscale become RGB (transparent areas composited over white); only the first frame of an
    animation is used. Zero-byte, truncated and non-image files, and images over `max_pixels`,
    raise an error that names the file.
    """
    name = str(source) if isinstance(source, (str, Path)) else "<upload>"
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise ImageLoadError(f"{name}: no such file" if not path.exists() else f"{name}: not a file")
        if path.stat().st_size == 0:
            raise ImageLoadError(f"{name}: empty file (0 bytes)")
    elif isinstance(source, bytes):
        if not source:
            raise ImageLoadError(f"{name}: empty file (0 bytes)")
        source = io.BytesIO(source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as image:
                width, height = image.size
                if width * height > max_pixels:
                    raise ImageLoadError(
                        f"{name}: image is {width}x{height} = {width * height / 1e6:.0f} megapixels, "
                        f"over the limit of {max_pixels / 1e6:.0f} (possible decompression bomb)"
                    )
                image.seek(0)  # first frame of an animation
                image.load()
                image = ImageOps.exif_transpose(image)
                return to_rgb(image)
    except ImageLoadError:
        raise
    except FileNotFoundError:
        raise ImageLoadError(f"{name}: no such file") from None
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        reason = "not an image file" if isinstance(e, UnidentifiedImageError) else "too many pixels"
        raise ImageLoadError(f"{name}: {reason}") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:  # truncated or corrupt data
        raise ImageLoadError(f"{name}: corrupt or truncated image ({e})") from None


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert any PIL mode to 8-bit RGB; transparency is composited over white."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        array = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") or array.max() > 255 else 255.0
        array = np.clip(array / top * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(array, mode="L").convert("RGB")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")  # L, P, CMYK, YCbCr, 1, ...


@dataclass(frozen=True)
class ImageTransform:
    """Resize to a square and normalise; the train variant adds augmentation that keeps the
    spatial meaning of captions (a mild crop and photometric jitter, never a horizontal flip,
    since captions say left and right; no hue change, since captions name colours)."""

    image_size: int
    train: bool = False
    augment: bool = False

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return _pipeline(self.image_size, self.train and self.augment)(image)


@functools.lru_cache(maxsize=None)
def _pipeline(image_size: int, augment: bool) -> v2.Compose:
    resize: list[v2.Transform]
    if augment:
        resize = [
            v2.RandomResizedCrop(image_size, scale=(0.85, 1.0), ratio=(0.9, 1.1), antialias=True),
            v2.ColorJitter(brightness=0.2, contrast=0.2),
        ]
    else:
        resize = [v2.Resize((image_size, image_size), antialias=True)]
    return v2.Compose(
        [v2.PILToTensor(), *resize, v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    )


def denormalize(images: torch.Tensor) -> torch.Tensor:
    """Undo the normalisation: (..., 3, H, W) -> values in [0, 1]."""
    mean = torch.tensor(IMAGENET_MEAN, device=images.device).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=images.device).view(3, 1, 1)
    return (images * std + mean).clamp(0, 1)
