"""The one image loader and the one transform that training, evaluation, CLI and demo share."""

from __future__ import annotations

import functools
import io
import re
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import nn
from torchvision.transforms import v2

from captioner.core.errors import ImageLoadError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# A decompression bomb guard: 50 megapixels is far above any camera photo a captioner needs and
# far below what exhausts memory when decoded (PIL's own default warns at 89 MP, errors at 179 MP).
MAX_PIXELS = 50_000_000


# The formats the project reads. Pillow can open some forty; every other plugin is unreachable
# from here, since some hand data to outside programs (EPS and PostScript go to Ghostscript) and
# most are rarely exercised parsers that an upload has no reason to reach.
SUPPORTED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
_HEADER_BYTES = 64  # enough for every plugin's signature check


def load_image(source: str | Path | bytes | BinaryIO, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """Read an image file as an upright 8-bit RGB picture, or raise `ImageLoadError`.

    Only `SUPPORTED_FORMATS` are opened; a file of another format (EPS, PDF, PSD, ICO, ...) is
    refused by name, read only as far as its signature. EXIF orientation is applied (a malformed
    EXIF block leaves the picture as stored); modes L, LA, P (with transparency), RGBA, CMYK,
    LAB, 16-bit and 32-bit greyscale become RGB (transparent areas composited over white); only
    the first frame of an animation or the first page of a TIFF is used. Zero-byte, truncated and
    non-image files, and images over `max_pixels` (checked from the header, before decoding),
    raise an error that names the file.
    """
    return open_checked(source, decode_rgb, max_pixels)


def decode_rgb(image: Image.Image) -> Image.Image:
    """An opened, checked image decoded as `load_image` returns it: the first frame, upright, RGB."""
    image.seek(0)  # first frame of an animation, first page of a TIFF
    image.load()
    return to_rgb(upright(image))


T = TypeVar("T")


def open_checked(source: str | Path | bytes | BinaryIO, finish: Callable[[Image.Image], T], max_pixels: int = MAX_PIXELS) -> T:
    """`finish(image)` on the file opened with `load_image`'s checks (supported format, a
    non-empty size under `max_pixels`, read from the header only); every failure, in `finish`
    too, is an `ImageLoadError` naming the file."""
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
            warnings.simplefilter("ignore", UserWarning)  # Pillow's notes on damaged metadata
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with open_image(source, name) as image:
                width, height = image.size
                if width < 1 or height < 1:
                    raise ImageLoadError(f"{name}: image is {width}x{height} pixels (empty)")
                if width * height > max_pixels:
                    raise ImageLoadError(
                        f"{name}: image is {width}x{height} = {width * height / 1e6:.0f} megapixels, "
                        f"over the limit of {max_pixels / 1e6:.0f} (possible decompression bomb)"
                    )
                return finish(image)
    except ImageLoadError:
        raise
    except FileNotFoundError:
        raise ImageLoadError(f"{name}: no such file") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        # Pillow's own header check (at 89 MP) fired before ours: the same message as ours.
        found = re.search(r"\((\d+) pixels\)", str(e))
        pixels = f"{int(found.group(1)) / 1e6:.0f} megapixels" if found else "too many pixels"
        raise ImageLoadError(
            f"{name}: image has {pixels}, over the limit of {max_pixels / 1e6:.0f} (possible decompression bomb)"
        ) from None
    except MemoryError:
        raise ImageLoadError(f"{name}: too large to decode in memory") from None
    # Pillow's decoders report damaged data with any of these (struct.error from short headers,
    # IndexError/KeyError/TypeError from inconsistent TIFF and EXIF tags): a bad file, not a bug.
    except (OSError, SyntaxError, ValueError, EOFError, struct.error, IndexError, KeyError, TypeError, ZeroDivisionError) as e:
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise ImageLoadError(f"{name}: corrupt or truncated image ({reason})") from None


def open_image(source: str | Path | BinaryIO, name: str | None = None) -> Image.Image:
    """`Image.open` restricted to `SUPPORTED_FORMATS` (header only, nothing decoded yet).

    A file no supported plugin accepts is named by the format whose signature it carries, found
    with Pillow's prefix checks alone, so no other plugin's parser ever runs on it.
    """
    name = name or str(source)
    try:
        return Image.open(source, formats=SUPPORTED_FORMATS)
    except UnidentifiedImageError:
        pass
    raise ImageLoadError(f"{name}: {_describe_refused(source)}; supported formats: {', '.join(SUPPORTED_FORMATS)}")


def _describe_refused(source: str | Path | BinaryIO) -> str:
    """'EPS format (by its signature), which this project does not read', or 'not an image file' for an unknown signature."""
    if isinstance(source, (str, Path)):
        with open(source, "rb") as f:
            prefix = f.read(_HEADER_BYTES)
    else:
        source.seek(0)
        prefix = source.read(_HEADER_BYTES)
    Image.init()  # registers every plugin's signature check; opening nothing
    for format_id, (_, accept) in Image.OPEN.items():
        if format_id in SUPPORTED_FORMATS or accept is None:
            continue
        try:
            accepted = accept(prefix)
        except Exception:  # noqa: BLE001 - a signature check that chokes is no match
            accepted = False
        if accepted:
            return f"{format_id} format (by its signature), which this project does not read"
    if prefix.lstrip().startswith((b"%!", b"%PDF")):
        return "not an image file (a PostScript or PDF document)"
    return "not an image file"


def upright(image: Image.Image) -> Image.Image:
    """Apply the EXIF orientation; a malformed EXIF block leaves the picture as stored."""
    try:
        return ImageOps.exif_transpose(image)
    except Exception:  # noqa: BLE001 - EXIF is metadata: its damage must not refuse a good picture
        return image


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert any PIL mode to 8-bit RGB; transparency is composited over white."""
    if image.mode == "RGB":
        return image
    if image.mode.startswith(("I", "F")):  # I;16, I;16B, I;16L, I;16S (TIFF), I (32-bit), F
        array = np.nan_to_num(np.asarray(image, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        top = 65535.0 if image.mode.startswith("I;16") or array.max() > 255 else 255.0
        array = np.clip(array / top * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(array, mode="L").convert("RGB")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBa", "La"):  # premultiplied alpha (TIFF): undo it first
        image = image.convert("RGBA") if image.mode == "RGBa" else image.convert("LA")
    if image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")  # L, P, CMYK, YCbCr, 1, ...


@dataclass(frozen=True)
class ImageTransform:
    """Resize to a square, as uint8 (3, S, S); the train variant adds augmentation that keeps the
    spatial meaning of captions (a mild crop and photometric jitter, never a horizontal flip,
    since captions say left and right; no hue change, since captions name colours).

    The float conversion and normalisation run on the device, inside the encoder (its
    `PixelNormalization`, with the backbone's own statistics): a uint8 image crosses to the
    device in a quarter of the bytes.
    """

    image_size: int
    train: bool = False
    augment: bool = False

    def __call__(self, image: Image.Image | torch.Tensor) -> torch.Tensor:
        """A PIL picture or a uint8 (3, H, W) tensor -> uint8 (3, S, S)."""
        return self.pipeline()(image)

    def pipeline(self) -> v2.Compose:
        """The steps this transform runs (cached per size and augmentation)."""
        return _pipeline(self.image_size, self.train and self.augment)

    def describe(self) -> list[str]:
        """Every step from the decoded picture to the uint8 image, as the transform objects that
        run them state their settings: a changed step changes this description. The encoder's
        `PixelNormalization.describe()` continues it to the encoder's input."""
        return [repr(step) for step in self.pipeline().transforms]


CROP_MIN_SCALE = 0.85  # each side of the training crop keeps at least this fraction of the image's


def crop_window(height: int, width: int, min_scale: float = CROP_MIN_SCALE) -> tuple[int, int, int, int]:
    """A random window (top, left, h, w) inside a height x width image, from torch's RNG.

    Each side keeps an independent random min_scale..1 of the image's side, so the window has
    the photo's aspect on average (a fixed aspect range has no valid window on a 4:3 photo, and
    torchvision's RandomResizedCrop then falls back to one centre crop every time); the position
    is uniform over the valid ones, so the mean window centre is the image centre. At scale 1
    the window is the whole image.
    """
    side_scales = torch.empty(2).uniform_(min_scale, 1.0)  # (2,): height, width
    h = max(1, round(height * float(side_scales[0])))
    w = max(1, round(width * float(side_scales[1])))
    top = int(torch.randint(height - h + 1, ()))
    left = int(torch.randint(width - w + 1, ()))
    return top, left, h, w


@dataclass(frozen=True)
class RandomWindowCrop:
    """Crop a `crop_window` and squash it to (size, size): on average the geometry evaluation
    sees (the whole image squashed to a square), and exactly it at min_scale 1."""

    size: int
    min_scale: float = CROP_MIN_SCALE

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        top, left, h, w = crop_window(*image.shape[-2:], self.min_scale)
        return v2.functional.resized_crop(image, top, left, h, w, [self.size, self.size], antialias=True)  # (3, S, S)


@functools.lru_cache(maxsize=None)
def _pipeline(image_size: int, augment: bool) -> v2.Compose:
    if augment:
        return v2.Compose([v2.PILToTensor(), RandomWindowCrop(image_size), v2.ColorJitter(brightness=0.2, contrast=0.2)])
    # Pillow's bilinear resize of the picture, then the uint8 tensor: the resize is Pillow's own, so
    # a runtime without torch (captioner.deploy) preprocesses to the same bytes (torchvision's
    # tensor resize rounds a few pixels one level apart). A uint8 tensor given instead is resized
    # by torchvision.
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
        """The steps `normalize_images` runs with these statistics, named as the torchvision
        transforms that compute the same numbers to the bit (tests/test_input_pipeline.py
        holds the two together), so a store records them as it records the resize."""
        return [repr(v2.ToDtype(torch.float32, scale=True)), repr(v2.Normalize(list(self.mean), list(self.std)))]


IMAGENET = PixelStatistics(IMAGENET_MEAN, IMAGENET_STD)


class PixelNormalization(nn.Module):
    """uint8 images -> float32 normalised with `statistics`, on the images' device.

    The constants are buffers, so they live on the encoder's device and a training step copies
    nothing from the host (v2.Normalize would make both from Python lists at every call, two
    copies that wait for the GPU). Not persistent: state dicts, checkpoints and feature-store
    fingerprints do not hold them (the encoder's config names the statistics).
    """

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


def normalize_images(images: torch.Tensor, mean: torch.Tensor | None = None, std: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 images (..., 3, H, W) as `ImageTransform` makes them -> normalised float32, on
    their own device; the ops of `PixelStatistics.describe()` in its order (x * (1/255), then
    (x - mean) / std), so the numbers are bit-identical to torchvision's on the CPU.

    `mean` and `std` (3, 1, 1), on the images' device (`PixelNormalization` keeps them as
    buffers). Default: ImageNet's, made here."""
    if images.dtype != torch.uint8:
        raise TypeError(f"normalize_images: expected uint8 images, got {images.dtype}")
    if mean is None or std is None:
        mean, std = IMAGENET.tensors(images.device)
    scaled = images.to(torch.float32).mul_(1.0 / 255)  # (..., 3, H, W): v2.ToDtype(scale=True)
    return scaled.sub(mean).div_(std)  # (..., 3, H, W): v2.Normalize
