"""The one image loader: every bad file kind gives a clear error; every mode becomes RGB."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captioner.core.errors import ImageLoadError
from captioner.data.image_files import load_image
from captioner.data.image_transform import ImageTransform, normalize_images


def save(image: Image.Image, path: Path, **options) -> Path:
    image.save(path, **options)
    return path


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ImageLoadError, match=r"nope\.jpg: no such file"):
        load_image(tmp_path / "nope.jpg")


def test_a_link_to_nothing_and_a_loop_of_links_say_so(tmp_path: Path) -> None:
    """Both were "no such file", though the user can see the file listed."""
    (tmp_path / "link.jpg").symlink_to("gone.jpg")
    (tmp_path / "a.jpg").symlink_to("b.jpg")
    (tmp_path / "b.jpg").symlink_to("a.jpg")
    with pytest.raises(ImageLoadError, match=r"link\.jpg: a link to gone\.jpg, which does not exist$"):
        load_image(tmp_path / "link.jpg")
    with pytest.raises(ImageLoadError, match=r"a\.jpg: a loop of symbolic links$"):
        load_image(tmp_path / "a.jpg")


def test_zero_byte_file(tmp_path: Path) -> None:
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(ImageLoadError, match=r"empty\.jpg: empty file"):
        load_image(tmp_path / "empty.jpg")


def test_not_an_image(tmp_path: Path) -> None:
    (tmp_path / "notes.jpg").write_text("this is not a picture")
    with pytest.raises(ImageLoadError, match=r"notes\.jpg: not an image file"):
        load_image(tmp_path / "notes.jpg")


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_file(tmp_path: Path, fmt: str) -> None:
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    data = io.BytesIO()
    noise.save(data, format=fmt)
    (tmp_path / "cut.img").write_bytes(data.getvalue()[: len(data.getvalue()) // 2])
    with pytest.raises(ImageLoadError, match=r"cut\.img: corrupt or truncated"):
        load_image(tmp_path / "cut.img")


def test_decompression_bomb(tmp_path: Path) -> None:
    path = save(Image.new("1", (4000, 3000)), tmp_path / "bomb.png")  # 12 MP, a few kB on disk
    with pytest.raises(ImageLoadError, match=r"bomb\.png: image is 4000x3000 .* over the limit"):
        load_image(path, max_pixels=10_000_000)
    assert load_image(path, max_pixels=20_000_000).size == (4000, 3000)


def test_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(ImageLoadError, match="not a file"):
        load_image(tmp_path)


def rgb_of(image: Image.Image) -> np.ndarray:
    return np.asarray(image)


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: Image.new("L", (8, 8), 100), (100, 100, 100)),
        (lambda: Image.new("LA", (8, 8), (100, 0)), (255, 255, 255)),  # fully transparent -> white
        (lambda: Image.new("RGBA", (8, 8), (200, 10, 10, 255)), (200, 10, 10)),
        (lambda: Image.new("RGBA", (8, 8), (0, 0, 0, 0)), (255, 255, 255)),
        (lambda: Image.new("CMYK", (8, 8), (0, 255, 255, 0)), (255, 0, 0)),
        (lambda: Image.fromarray(np.full((8, 8), 65535, dtype=np.uint16)), (255, 255, 255)),
        (lambda: Image.fromarray(np.full((8, 8), 32768, dtype=np.uint16)), (128, 128, 128)),
    ],
    ids=["L", "LA", "RGBA-opaque", "RGBA-transparent", "CMYK", "I16-white", "I16-grey"],
)
def test_modes_become_rgb(tmp_path: Path, make, expected) -> None:
    image = make()
    fmt = "TIFF" if image.mode == "CMYK" else "PNG"
    path = save(image, tmp_path / f"img.{fmt.lower()}")
    loaded = load_image(path)
    assert loaded.mode == "RGB" and loaded.size == (8, 8)
    assert tuple(int(v) for v in rgb_of(loaded)[4, 4]) == pytest.approx(expected, abs=2)


def test_palette_with_transparency(tmp_path: Path) -> None:
    image = Image.new("P", (8, 8), 1)
    image.putpalette([0, 0, 0, 0, 200, 0] + [0] * 762)
    image.info["transparency"] = 0
    image.putpixel((0, 0), 0)  # the transparent index
    loaded = load_image(save(image, tmp_path / "p.png", transparency=0))
    assert tuple(rgb_of(loaded)[0, 0]) == (255, 255, 255)
    assert tuple(rgb_of(loaded)[4, 4]) == (0, 200, 0)


def test_cmyk_jpeg(tmp_path: Path) -> None:
    path = save(Image.new("CMYK", (16, 16), (0, 255, 255, 0)), tmp_path / "cmyk.jpg")
    assert load_image(path).mode == "RGB"


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    image = Image.new("RGB", (40, 20), (255, 0, 0))
    image.paste((0, 0, 255), (0, 0, 20, 20))  # left half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    path = save(image, tmp_path / "rotated.jpg", exif=exif, quality=95)
    loaded = load_image(path)
    assert loaded.size == (20, 40)
    top = rgb_of(loaded)[5, 10]
    assert top[2] > 200 and top[0] < 60  # the blue half is now on top


def test_animated_gif_uses_the_first_frame(tmp_path: Path) -> None:
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 255, 0))]
    path = tmp_path / "anim.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100)
    assert tuple(rgb_of(load_image(path))[0, 0]) == (255, 0, 0)


def test_bytes_and_uploads() -> None:
    data = io.BytesIO()
    Image.new("RGB", (5, 7)).save(data, format="PNG")
    assert load_image(data.getvalue()).size == (5, 7)
    with pytest.raises(ImageLoadError, match="<upload>: not an image"):
        load_image(b"garbage")


def test_transform_shapes_and_normalisation() -> None:
    image = Image.new("RGB", (50, 30), (124, 116, 104))  # about the ImageNet mean
    tensor = ImageTransform(32)(image)
    assert tensor.shape == (3, 32, 32) and tensor.dtype == torch.uint8  # normalised on the device
    assert normalize_images(tensor).abs().max() < 0.05
    augmented = ImageTransform(32, train=True, augment=True)(image)
    assert augmented.shape == (3, 32, 32)


def test_augmentation_never_flips() -> None:
    """Captions say left and right: a left-red right-blue image keeps red on the left."""
    image = Image.new("RGB", (64, 64), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 32, 64))
    transform = ImageTransform(64, train=True, augment=True)
    torch.manual_seed(0)
    for _ in range(20):
        tensor = transform(image)
        assert tensor[0, :, :16].float().mean() > tensor[0, :, -16:].float().mean()
