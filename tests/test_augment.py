"""The training crop on real photo shapes (4:3, 3:4, 16:9): it varies, stays inside the image,
is centred on the geometry evaluation sees, equals evaluation when switched off, and replays
exactly from a seed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from helpers import tiny_vocab
from PIL import Image
from torchvision.transforms.v2.functional import pil_to_tensor

from captioner.data.batching import CaptionDataset
from captioner.data.image_files import load_image
from captioner.data.image_transform import CROP_MIN_SCALE, ImageTransform, RandomWindowCrop, crop_window
from captioner.data.records import ImageRecord

SHAPES = {"4:3": (500, 375), "3:4": (375, 500), "16:9": (640, 360)}  # (width, height)
SIZE = 64
DRAWS = 400


def first_photo(shared_data: Path) -> Path:
    return min((shared_data / "flickr8k" / "images").glob("*.jpg"))


def edge_image(width: int, height: int) -> Image.Image:
    """Dark with a bright quadrant right of x = W/4 and below y = H/4: the output's edge positions
    say where the crop window was, whatever the brightness and contrast jitter did."""
    image = Image.new("RGB", (width, height), (20, 20, 20))
    image.paste((230, 230, 230), (width // 4, height // 4, width, height))
    return image


def edge_position(profile: torch.Tensor) -> float:
    """Where a dark-to-bright profile (L,) crosses halfway, in pixels (linear between samples)."""
    half = (profile.min() + profile.max()) / 2
    i = int((profile >= half).nonzero()[0])
    return i - float((profile[i] - half) / (profile[i] - profile[i - 1])) + 0.5 if i else 0.0


def edges(tensor: torch.Tensor) -> tuple[float, float]:
    """(x, y) of the bright quadrant's corner in a (3, S, S) uint8 output, as fractions of S."""
    bright = tensor.float().mean(dim=0)  # (S, S)
    return edge_position(bright[-1]) / SIZE, edge_position(bright[:, -1]) / SIZE


@pytest.mark.parametrize("shape", SHAPES)
def test_crop_windows_vary_inside_the_image_around_its_centre(shape: str) -> None:
    width, height = SHAPES[shape]
    torch.manual_seed(0)
    windows = torch.tensor([crop_window(height, width) for _ in range(DRAWS)], dtype=torch.float64)  # (DRAWS, 4)
    top, left, h, w = windows.unbind(1)
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= height).all() and (left + w <= width).all()
    assert (h >= round(CROP_MIN_SCALE * height)).all() and (w >= round(CROP_MIN_SCALE * width)).all()
    assert len({tuple(row) for row in windows.tolist()}) > DRAWS * 0.9  # nearly every draw differs
    # Each side is drawn on its own, so the window's aspect follows the photo's: both sides span the range.
    assert h.min() < 0.87 * height and h.max() > 0.98 * height and w.min() < 0.87 * width and w.max() > 0.98 * width
    centre_y, centre_x = (top + h / 2).mean(), (left + w / 2).mean()
    assert abs(centre_y - height / 2) < 0.01 * height and abs(centre_x - width / 2) < 0.01 * width


@pytest.mark.parametrize("shape", SHAPES)
def test_augmented_transform_moves_the_content_around_where_evaluation_puts_it(shape: str) -> None:
    """Through the whole training transform (crop and jitter): the bright quadrant's corner moves
    from draw to draw, and on average sits where evaluation puts it, zoomed about the centre
    by the mean of 1/scale (a side keeps a uniform scale s in [m, 1], so E[1/s] = ln(1/m)/(1-m)),
    on both axes. A fixed centre crop (torchvision's fallback when no window fits its aspect
    range) fails both: it never moves, and on the long side it zooms by W/H, not E[1/s]."""
    width, height = SHAPES[shape]
    image = edge_image(width // 2, height // 2)  # the photo's shape at half size: 200 draws in a second
    evaluation = torch.tensor(edges(ImageTransform(SIZE)(image)))  # (2,): x, y as fractions of S
    train = ImageTransform(SIZE, train=True, augment=True)
    torch.manual_seed(0)
    seen = torch.tensor([edges(train(image)) for _ in range(200)])  # (200, 2)
    assert (seen.std(dim=0) > 0.01).all(), seen.std(dim=0)
    zoom = math.log(1 / CROP_MIN_SCALE) / (1 - CROP_MIN_SCALE)
    expected = 0.5 + (evaluation - 0.5) * zoom  # (2,)
    assert ((seen.mean(dim=0) - expected).abs() < 0.01).all(), (seen.mean(dim=0), expected)


@pytest.mark.parametrize("shape", SHAPES)
def test_unaugmented_crop_is_the_evaluation_transform(shape: str) -> None:
    image = edge_image(*SHAPES[shape])
    evaluation = ImageTransform(SIZE)(image)
    assert torch.equal(ImageTransform(SIZE, train=True, augment=False)(image), evaluation)
    assert_same_but_rounding(RandomWindowCrop(SIZE, min_scale=1.0)(pil_to_tensor(image)), evaluation)


def assert_same_but_rounding(crop: torch.Tensor, evaluation: torch.Tensor) -> None:
    """The training crop resizes a tensor with torchvision (as the device path does), evaluation
    the picture with Pillow (as the ONNX runtime does): at scale 1 they agree to one level of 255
    on a few pixels, their rounding."""
    difference = (crop.int() - evaluation.int()).abs()
    assert crop.shape == evaluation.shape and int(difference.max()) <= 1
    assert float((difference > 0).float().mean()) < 0.1


def test_real_photo(shared_data: Path) -> None:
    path = first_photo(shared_data)
    image = load_image(path)
    width, height = image.size
    assert width != height  # a real 4:3 or 3:4 photo
    evaluation = ImageTransform(SIZE)(image)
    assert_same_but_rounding(RandomWindowCrop(SIZE, min_scale=1.0)(pil_to_tensor(image)), evaluation)
    train = ImageTransform(SIZE, train=True, augment=True)
    outputs = []
    for seed in range(6):
        torch.manual_seed(seed)
        outputs.append(train(image))
        top, left, h, w = crop_window(height, width)
        assert 0 <= top <= height - h and 0 <= left <= width - w
    assert all(not torch.equal(outputs[0], other) for other in outputs[1:])
    torch.manual_seed(3)
    assert torch.equal(train(image), outputs[3])  # the same seed, the same crop and jitter


def test_dataset_draw_replays_the_augmentation(shared_data: Path, tmp_path: Path) -> None:
    """CaptionDataset seeds the augmentation of item (i, draw) from draw alone: the same draw
    gives the same pixels whatever the process's RNG did before, another draw other pixels."""
    record = ImageRecord(0, first_photo(shared_data), ("a red circle", "a blue square"))
    dataset = CaptionDataset([record], tiny_vocab(), ImageTransform(SIZE, train=True, augment=True), 10)
    torch.manual_seed(0)
    first, _, _ = dataset[(0, 7)]
    torch.rand(100)  # the process's RNG moves on; the item must not
    again, _, _ = dataset[(0, 7)]
    other, _, _ = dataset[(0, 8)]
    assert first.dtype == torch.uint8 and first.shape == (3, SIZE, SIZE)
    assert torch.equal(first, again) and not torch.equal(first, other)
