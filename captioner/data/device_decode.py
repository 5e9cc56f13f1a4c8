"""Training preprocessing on the device (`data.device_preprocess`), for nodes short of cores. `transform` runs the
`ImageTransform` there under each item's seed; `decode` also decodes the JPEGs there (nvjpeg)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2.functional import pil_to_tensor

from captioner.data.image_files import MAX_PIXELS, decode_rgb, load_image, open_checked
from captioner.data.image_transform import ImageTransform

DEVICE_MODES = ("RGB", "L")  # JPEG colour modes decode_jpeg turns into RGB itself
EXIF_ORIENTATION = 0x0112
PREPROCESS_CHOICES = ("none", "transform", "decode")  # data.device_preprocess


@dataclass(frozen=True)
class EncodedJpeg:
    """A checked JPEG file's bytes, for the device to decode."""

    data: torch.Tensor  # (L,) uint8: the file as stored
    orientation: int  # EXIF orientation: 1 (as stored) to 8
    name: str


def read_for_device(path: str | Path | bytes, ship_jpeg: bool = True, max_pixels: int = MAX_PIXELS,
                    name: str | None = None) -> EncodedJpeg | torch.Tensor:
    """In a worker: with `ship_jpeg`, a checked baseline RGB or grey JPEG as its bytes and EXIF orientation; any
    other file (progressive JPEGs too: nvjpeg may refuse them) decoded as `load_image` does, uint8 (3, H, W)."""

    def finish(image: Image.Image) -> EncodedJpeg | torch.Tensor:
        if (not ship_jpeg or image.format != "JPEG" or image.mode not in DEVICE_MODES
                or image.info.get("progressive")):
            return pil_to_tensor(decode_rgb(image))  # (3, H, W)
        encoded = path if isinstance(path, bytes) else Path(path).read_bytes()
        data = torch.frombuffer(bytearray(encoded), dtype=torch.uint8)  # (L,)
        return EncodedJpeg(data, exif_orientation(image), name or str(path))

    return open_checked(path, finish, max_pixels, name)


def exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation tag, 1 when absent, out of range or unreadable (as `upright` treats it)."""
    try:
        value = image.getexif().get(EXIF_ORIENTATION, 1)
    except Exception:  # noqa: BLE001 - damaged EXIF leaves the picture as stored, as in `upright`
        return 1
    return value if value in range(1, 9) else 1


# EXIF orientation -> what turns an image (C, H, W) as stored upright, as PIL's `ImageOps.exif_transpose` does
UPRIGHT: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    2: lambda image: image.flip(-1),  # mirrored left-right
    3: lambda image: image.flip(-2, -1),  # rotated 180
    4: lambda image: image.flip(-2),  # mirrored top-bottom
    5: lambda image: image.transpose(-2, -1),  # (C, W, H): transposed
    6: lambda image: image.rot90(-1, dims=(-2, -1)),  # (C, W, H): turned 90 degrees clockwise
    7: lambda image: image.transpose(-2, -1).flip(-2, -1),  # (C, W, H): transverse
    8: lambda image: image.rot90(1, dims=(-2, -1)),  # (C, W, H): turned 90 degrees counter-clockwise
}


def orient(image: torch.Tensor, orientation: int) -> torch.Tensor:
    """image (C, H, W) as stored -> upright (orientation 1 and unknown ones: as stored)."""
    return UPRIGHT[orientation](image) if orientation in UPRIGHT else image


def decode_jpegs(images: list[EncodedJpeg], device: torch.device | str) -> list[torch.Tensor]:
    """Decode on `device` in one call as upright RGB, uint8 (3, H, W) each; if it fails (naming no file),
    each alone, falling back to `load_image`, whose `ImageLoadError` names a corrupt file."""
    try:
        decoded = decode_jpeg([item.data for item in images], mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        return [decode_one(item, device) for item in images]
    return [orient(image, item.orientation) for image, item in zip(decoded, images)]


def decode_one(item: EncodedJpeg, device: torch.device | str) -> torch.Tensor:
    """One JPEG on `device`, or through PIL's `load_image` when the device refuses it -> uint8 (3, H, W)."""
    try:
        return orient(decode_jpeg(item.data, mode=ImageReadMode.RGB, device=device), item.orientation)
    except RuntimeError:
        return pil_to_tensor(load_image(item.name)).to(device)  # (3, H, W)


def gpu_jpeg_decoding(device: torch.device) -> bool:
    """Whether `device` decodes JPEGs itself: CUDA, with torchvision's nvjpeg kernels built in."""
    return device.type == "cuda" and hasattr(torch.ops.image, "decode_jpegs_cuda")


def device_preprocess(requested: str, device: torch.device) -> str:
    """What `data.device_preprocess` does on `device`: "none" off CUDA, `transform` without nvjpeg."""
    if device.type != "cuda":
        return "none"
    return "transform" if requested == "decode" and not gpu_jpeg_decoding(device) else requested


@dataclass(frozen=True)
class PendingImage:
    """A training item whose transform (and decoding) wait for the device (CaptionBatch.to)."""

    source: EncodedJpeg | torch.Tensor  # a JPEG to decode there, or the uint8 (3, H, W) picture decoded
    transform: ImageTransform
    seed: int | None  # the item's augmentation seed (CaptionDataset's draw); None: the process's RNG


def transform_on_device(pending: list[PendingImage], device: torch.device | str) -> torch.Tensor:
    """The device half of the loader: decode on `device`, then each item's transform under its seed -> (B, 3, S, S)."""
    jpegs = [item.source for item in pending if isinstance(item.source, EncodedJpeg)]
    decoded = iter(decode_jpegs(jpegs, device) if jpegs else [])
    images = []
    for item in pending:
        image = next(decoded) if isinstance(item.source, EncodedJpeg) else item.source.to(device)  # (3, H, W)
        images.append(item.transform(image, item.seed))  # (3, S, S), on the device; crop and jitter from the CPU RNG
    return torch.stack(images)  # (B, 3, S, S)
