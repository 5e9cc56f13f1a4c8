"""Images -> the encoder's input, uint8 (B, 3, S, S), with Pillow and numpy: the same bytes as the
PyTorch transform (`captioner.data.images.ImageTransform`: Pillow's bilinear resize of the upright
RGB picture, then HWC -> CHW), from the same loader, which refuses the same files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from captioner.core.errors import ImageLoadError
from captioner.data.pictures import load_image, to_rgb, upright

ImageInput = str | Path | bytes | Image.Image  # a path, an encoded image file, or a picture


def picture_of(image: ImageInput, position: str | None = None) -> Image.Image:
    """A path, an encoded file's bytes or a PIL image -> the upright RGB picture `load_image`
    makes of a file; `position` ("image 2 of 5") starts the error of an image in a list."""
    if isinstance(image, Image.Image):
        return to_rgb(upright(image))
    try:
        if not isinstance(image, (str, Path, bytes)):
            raise ImageLoadError(f"expected a path, bytes or a PIL image, got {type(image).__name__}")
        return load_image(image)
    except ImageLoadError as e:
        if position is None and isinstance(image, (str, Path)):
            raise  # its message names the file
        raise ImageLoadError(f"caption: {position or 'the image'}: {e}") from None


def image_array(picture: Image.Image, size: int) -> np.ndarray:
    """An RGB picture -> uint8 (3, size, size): Pillow's bilinear resize, channels first."""
    resized = np.asarray(picture.resize((size, size), Image.BILINEAR))  # (S, S, 3)
    return np.ascontiguousarray(resized.transpose(2, 0, 1))  # (3, S, S)


def image_batch(pictures: list[Image.Image], size: int) -> np.ndarray:
    """RGB pictures -> uint8 (B, 3, size, size)."""
    return np.stack([image_array(p, size) for p in pictures])  # (B, 3, S, S)
