"""Images -> the encoder's input, uint8 (B, 3, S, S), with Pillow and numpy: the same bytes as the
PyTorch transform (`captioner.data.image_transform.ImageTransform`: Pillow's bilinear resize of the upright
RGB picture, then HWC -> CHW), from the same loader, which refuses the same files."""

from __future__ import annotations

import numpy as np
from PIL import Image


def image_array(picture: Image.Image, size: int) -> np.ndarray:
    """An RGB picture -> uint8 (3, size, size): Pillow's bilinear resize, channels first."""
    resized = np.asarray(picture.resize((size, size), Image.BILINEAR))  # (S, S, 3)
    return np.ascontiguousarray(resized.transpose(2, 0, 1))  # (3, S, S)


def image_batch(pictures: list[Image.Image], size: int) -> np.ndarray:
    """RGB pictures -> uint8 (B, 3, size, size)."""
    return np.stack([image_array(p, size) for p in pictures])  # (B, 3, S, S)
