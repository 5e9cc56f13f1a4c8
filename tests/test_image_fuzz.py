"""Fuzz the one image loader: every file either captions or gets one line of ImageLoadError.

Each case is written to a file and goes through what the CLI and the demo do with an upload:
`load_image`, the evaluation transform and a tiny model's greedy decoding. Nothing but
`ImageLoadError` may escape, its message is one line that starts with the file's path, and
the files that load become 8-bit RGB pictures that caption. Each test prints how many files it
tried (`pytest -s tests/test_image_fuzz.py`); the module prints the total.
"""

from __future__ import annotations

import io
import struct
import subprocess
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_model
from PIL import EpsImagePlugin, Image

from captioner.core.errors import ImageLoadError
from captioner.data.image_files import MAX_PIXELS, SUPPORTED_FORMATS, load_image
from captioner.data.image_transform import ImageTransform
from captioner.models.captioner import Captioner

SEED = 12
TRIED: dict[str, int] = {}


@pytest.fixture(scope="module")
def model() -> Iterator[Captioner]:
    torch.set_num_threads(1)
    yield tiny_model()
    print(f"\nimage fuzz: {sum(TRIED.values())} files tried ({', '.join(f'{k} {v}' for k, v in TRIED.items())})")


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    data = io.BytesIO()
    image.save(data, format=fmt, **options)
    return data.getvalue()


def noise(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).convert(mode)


class Outcome:
    """Tries files and keeps what happened to each."""

    def __init__(self, tmp_path: Path, model: Captioner, kind: str) -> None:
        self.tmp_path, self.model, self.kind = tmp_path, model, kind
        self.loaded: dict[str, Image.Image] = {}
        self.refused: dict[str, str] = {}
        self.tensors: list[torch.Tensor] = []
        self.transform = ImageTransform(model.image_size)

    def __call__(self, name: str, data: bytes) -> None:
        path = self.tmp_path / name
        path.write_bytes(data)
        try:
            image = load_image(path)
        except ImageLoadError as e:  # anything else fails the test with its traceback
            message = str(e)
            assert "\n" not in message and message.startswith(str(path)), message
            self.refused[name] = message
            return
        assert image.mode == "RGB" and image.width >= 1 and image.height >= 1, (name, image.mode, image.size)
        self.loaded[name] = image
        self.tensors.append(self.transform(image))

    def caption_all(self) -> None:
        """Caption every loaded file (in batches) and count the files tried."""
        TRIED[self.kind] = TRIED.get(self.kind, 0) + len(self.loaded) + len(self.refused)
        print(f"\n{self.kind}: {len(self.loaded) + len(self.refused)} files, {len(self.loaded)} captioned, "
              f"{len(self.refused)} refused")
        for start in range(0, len(self.tensors), 256):
            batch = torch.stack(self.tensors[start : start + 256])  # (B, 3, S, S)
            captions = self.model.caption(batch, beam_size=1, max_length=3)
            assert len(captions) == len(batch) and all(isinstance(c.text, str) for c in captions)


@pytest.fixture
def outcome(tmp_path: Path, model: Captioner, request: pytest.FixtureRequest) -> Outcome:
    return Outcome(tmp_path, model, request.node.name.removeprefix("test_"))


def valid_files() -> dict[str, bytes]:
    """A small noisy picture in every supported format."""
    picture = noise(12, 8)
    return {
        "JPEG": encode(picture, "JPEG", quality=90),
        "PNG": encode(picture, "PNG"),
        "WEBP": encode(picture, "WEBP", quality=80),
        "GIF": encode(picture.convert("P"), "GIF"),
        "BMP": encode(picture, "BMP"),
        "TIFF": encode(picture, "TIFF", compression="tiff_deflate"),
    }


def test_every_supported_format_captions(outcome: Outcome) -> None:
    files = valid_files()
    assert set(files) == set(SUPPORTED_FORMATS)
    for fmt, data in files.items():
        outcome(f"ok.{fmt.lower()}", data)
    outcome.caption_all()
    assert not outcome.refused and len(outcome.loaded) == len(SUPPORTED_FORMATS)


def test_random_bytes(outcome: Outcome) -> None:
    """Noise, and noise behind each supported format's signature (so its parser runs on it)."""
    rng = np.random.default_rng(SEED)
    signatures = [b"", b"\xff\xd8\xff\xe0", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"BM", b"II*\x00", b"MM\x00*",
                  b"RIFF\x00\x01\x00\x00WEBPVP8 "]
    for k, signature in enumerate(signatures):
        for i in range(40):
            body = rng.integers(0, 256, int(rng.integers(1, 3000)), dtype=np.uint8).tobytes()
            outcome(f"random_{k}_{i}.img", signature + body)
    outcome.caption_all()
    assert len(outcome.refused) >= 0.9 * len(signatures) * 40  # noise is almost never a picture


@pytest.mark.parametrize("fmt", SUPPORTED_FORMATS)
def test_every_truncation_point(outcome: Outcome, fmt: str) -> None:
    """Every prefix of a small file; the JPEG and PNG ones at every byte, as the issue asks."""
    data = valid_files()[fmt]
    for cut in range(1, len(data)):
        outcome(f"cut_{cut}.{fmt.lower()}", data[:cut])
    outcome.caption_all()
    assert len(outcome.loaded) + len(outcome.refused) == len(data) - 1
    assert len(outcome.refused) > len(data) // 2  # most prefixes lack the picture data


@pytest.mark.parametrize("fmt", SUPPORTED_FORMATS)
def test_flipped_bytes(outcome: Outcome, fmt: str) -> None:
    """Valid files with a few random bytes overwritten: damaged headers, tables and data."""
    data = valid_files()[fmt]
    rng = np.random.default_rng(SEED)
    for i in range(150):
        damaged = bytearray(data)
        for position in rng.integers(0, len(data), int(rng.integers(1, 5))):
            damaged[position] = int(rng.integers(0, 256))
        outcome(f"flip_{i}.{fmt.lower()}", bytes(damaged))
    outcome.caption_all()


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_header(width: int, height: int, body: bytes = b"") -> bytes:
    """A PNG whose IHDR claims width x height (8-bit RGB), with `body` as its compressed data."""
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + ihdr + png_chunk(b"IDAT",
                                                   body or zlib.compress(b"\x00" * 64)) + png_chunk(b"IEND", b"")


def patched(data: bytes, marker: bytes, offset: int, fmt: str, *values: int) -> bytes:
    at = data.index(marker) + offset
    packed = struct.pack(fmt, *values)
    return data[:at] + packed + data[at + len(packed) :]


def gif_sized(data: bytes, width: int, height: int) -> bytes:
    """A GIF whose screen and first frame claim width x height."""
    screen = patched(data, data[:6], 6, "<HH", width, height)
    descriptor = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)  # after the global palette
    assert screen[descriptor : descriptor + 1] == b","
    return screen[: descriptor + 5] + struct.pack("<HH", width, height) + screen[descriptor + 9 :]


ABSURD = [(65535, 65535), (100_000, 100_000), (2**31 - 1, 2**31 - 1), (1, 2**31 - 1), (2**31 - 1, 1), (10_000, 10_000)]


def test_absurd_dimensions_are_refused_before_decoding(outcome: Outcome) -> None:
    """Headers that claim far more pixels than the limit: refused from the header alone (the
    files are a few hundred bytes; decoding them would need gigabytes)."""
    files = valid_files()
    cases: dict[str, bytes] = {}
    for width, height in ABSURD:
        cases[f"png_{width}x{height}.png"] = png_header(width, height)
        if width < 65536 and height < 65536:  # JPEG and GIF store 16-bit sizes
            cases[f"jpeg_{width}x{height}.jpg"] = patched(files["JPEG"], b"\xff\xc0", 5, ">HH", height, width)
            cases[f"gif_{width}x{height}.gif"] = gif_sized(files["GIF"], width, height)
        if width < 2**31 and height < 2**31:
            cases[f"bmp_{width}x{height}.bmp"] = patched(files["BMP"], b"BM", 18, "<ii", width, height)
        if width <= 2**24 and height <= 2**24:  # WebP's extended header: 24-bit sizes minus one
            webp = encode(noise(8, 8, "RGBA"), "WEBP", lossless=True, exact=True)
            if b"VP8X" in webp:
                cases[f"webp_{width}x{height}.webp"] = patched(webp, b"VP8X", 12, "<I", width - 1)
    tiff = bytearray(encode(noise(4, 4), "TIFF"))
    image = Image.open(io.BytesIO(bytes(tiff)))
    for width, height in ABSURD:
        data = bytearray(tiff)
        for tag, value in ((256, width), (257, height)):  # ImageWidth, ImageLength as LONG entries
            entry = struct.pack("<HH", tag, image.tag_v2.tagtype[tag])
            at = bytes(data).index(entry, 8)
            data[at + 2 : at + 12] = struct.pack("<HII", 4, 1, value)
        cases[f"tiff_{width}x{height}.tif"] = bytes(data)
    for name, data in cases.items():
        outcome(name, data)
    outcome.caption_all()
    assert not outcome.loaded, sorted(outcome.loaded)
    assert all("megapixels, over the limit of 50 (possible decompression bomb)" in m for m in outcome.refused.values())


def test_zero_size_images(outcome: Outcome) -> None:
    outcome("empty.jpg", b"")
    for width, height in ((0, 0), (0, 10), (10, 0)):
        outcome(f"zero_{width}x{height}.png", png_header(width, height))
        outcome(f"zero_{width}x{height}.bmp", patched(valid_files()["BMP"], b"BM", 18, "<ii", width, height))
        outcome(f"zero_{width}x{height}.gif", gif_sized(valid_files()["GIF"], width, height))
    outcome.caption_all()
    assert not outcome.loaded and "empty file" in outcome.refused["empty.jpg"]


def test_extreme_aspect_ratios_caption(outcome: Outcome) -> None:
    """1x1, 1x10,000 and 10,000x1 pictures in every format that can hold them."""
    for width, height in ((1, 1), (1, 10_000), (10_000, 1)):
        picture = noise(width, height, seed=width)
        for fmt in SUPPORTED_FORMATS:
            if fmt == "WEBP" and max(width, height) > 16383:
                continue
            source = picture.convert("P") if fmt == "GIF" else picture
            outcome(f"{width}x{height}.{fmt.lower()}", encode(source, fmt))
    outcome.caption_all()
    assert not outcome.refused, outcome.refused
    assert outcome.loaded["1x10000.png"].size == (1, 10_000)


def mode_files() -> dict[str, bytes]:
    gradient = Image.fromarray(np.linspace(0, 65535, 64 * 48).reshape(48, 64).astype(np.uint16))  # I;16
    rgb = noise(24, 16)
    transparent = rgb.convert("P")
    transparent.info["transparency"] = 0
    return {
        "palette.png": encode(rgb.convert("P"), "PNG"),
        "palette_transparent.png": encode(transparent, "PNG", transparency=0),
        "palette.bmp": encode(rgb.convert("P"), "BMP"),
        "palette.tif": encode(rgb.convert("P"), "TIFF"),
        "bilevel.png": encode(rgb.convert("1"), "PNG"),
        "bilevel.tif": encode(rgb.convert("1"), "TIFF", compression="group4"),
        "grey.jpg": encode(rgb.convert("L"), "JPEG"),
        "grey_alpha.png": encode(rgb.convert("LA"), "PNG"),
        "rgba.png": encode(rgb.convert("RGBA"), "PNG"),
        "rgba.webp": encode(rgb.convert("RGBA"), "WEBP"),
        "rgba.tif": encode(rgb.convert("RGBA"), "TIFF"),
        "grey16.png": encode(gradient, "PNG"),
        "grey16.tif": encode(gradient, "TIFF"),
        "int32.tif": encode(gradient.convert("I"), "TIFF"),
        "float.tif": encode(gradient.convert("F"), "TIFF"),
        "cmyk.jpg": encode(rgb.convert("CMYK"), "JPEG"),
        "cmyk.tif": encode(rgb.convert("CMYK"), "TIFF"),
        "ycbcr.jpg": encode(rgb.convert("YCbCr"), "JPEG"),
        "lab.tif": encode(rgb.convert("LAB"), "TIFF"),
    }


def test_palette_16bit_cmyk_and_other_modes_caption(outcome: Outcome) -> None:
    for name, data in mode_files().items():
        outcome(name, data)
    outcome.caption_all()
    assert not outcome.refused, outcome.refused
    # 16-bit values are scaled to 8 bits, not clipped: the gradient still spans black to white.
    grey16 = np.asarray(outcome.loaded["grey16.png"])
    assert grey16.min() == 0 and grey16.max() == 255 and len(np.unique(grey16)) > 100


def test_animations_and_multipage_tiff_give_their_first_frame(outcome: Outcome) -> None:
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255)] * 10
    frames = [Image.new("RGB", (16, 16), c) for c in colours]
    outcome("anim.gif", encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0))
    outcome("anim.png", encode(frames[0], "PNG", save_all=True, append_images=frames[1:], duration=50))
    outcome("anim.webp", encode(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=50, lossless=True))
    outcome("pages.tif", encode(frames[0], "TIFF", save_all=True, append_images=frames[1:] * 20))
    outcome.caption_all()
    assert not outcome.refused, outcome.refused
    for image in outcome.loaded.values():
        assert image.getpixel((8, 8)) == (255, 0, 0)


def exif_jpeg(orientation: object) -> bytes:
    picture = Image.new("RGB", (16, 8), (0, 0, 0))
    picture.paste((255, 255, 255), (0, 0, 8, 8))  # the left half is white
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(picture, "JPEG", exif=exif.tobytes(), quality=95)


def test_exif_orientations_are_applied(outcome: Outcome) -> None:
    for orientation in range(1, 9):
        outcome(f"orientation_{orientation}.jpg", exif_jpeg(orientation))
    for odd in (0, 9, 65535):  # out-of-range orientations leave the picture as stored
        outcome(f"orientation_{odd}.jpg", exif_jpeg(odd))
    broken = exif_jpeg(6)
    outcome("exif_truncated.jpg", patched(broken, b"Exif\x00\x00", 6, "4s", b"II*\xff"))  # bad IFD offset
    outcome.caption_all()
    assert not outcome.refused, outcome.refused
    sizes = {n: outcome.loaded[f"orientation_{n}.jpg"].size for n in range(1, 9)}
    assert [sizes[n] for n in range(1, 9)] == [(16, 8)] * 4 + [(8, 16)] * 4  # 5-8 turn a quarter
    assert outcome.loaded["orientation_0.jpg"].size == outcome.loaded["orientation_9.jpg"].size == (16, 8)
    white_left = [np.asarray(outcome.loaded[f"orientation_{n}.jpg"].convert("L"))[:, :2].mean() > 128
                  for n in (1, 2, 3)]
    assert white_left == [True, False, False]  # 2 mirrors left-right, 3 turns half round


EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 64 64\n/Helvetica findfont 12 scalefont setfont\nshowpage\n%%EOF\n"


def refused_files() -> dict[str, tuple[bytes, str]]:
    """Files of formats the project does not read -> the format their refusal must name."""
    picture = noise(16, 16)
    return {
        "drawing.eps": (EPS, "EPS"),
        "drawing.jpg": (EPS, "EPS"),  # the suffix does not matter: the signature does
        "binary.eps": (b"\xc5\xd0\xd3\xc6" + struct.pack("<6I", 30, len(EPS), 0, 0, 0, 0) + b"\xff\xff" + EPS, "EPS"),
        "document.pdf": (encode(picture, "PDF"), "not an image file (a PostScript or PDF document)"),
        "icon.ico": (encode(picture, "ICO"), "ICO"),
        "picture.ppm": (encode(picture, "PPM"), "PPM"),
        "picture.pcx": (encode(picture, "PCX"), "PCX"),
        "picture.sgi": (encode(picture, "SGI"), "SGI"),
        "picture.qoi": (encode(picture, "QOI"), "QOI"),
        "picture.jp2": (encode(picture, "JPEG2000"), "JPEG2000"),
        "picture.dds": (encode(picture, "DDS"), "DDS"),
        "picture.xbm": (encode(picture.convert("1"), "XBM"), "XBM"),
        "picture.icns": (encode(picture, "ICNS"), "ICNS"),
        "vector.svg": (b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>', "not an image file"),
        "page.html": (b"<html><body>hello</body></html>", "not an image file"),
    }


def test_other_formats_are_refused_by_name(outcome: Outcome, monkeypatch: pytest.MonkeyPatch) -> None:
    """EPS would make Pillow run Ghostscript on the file: no plugin but the supported ones may
    even parse it, and no program may be started."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("an unsupported plugin or an outside program was reached")

    monkeypatch.setattr(EpsImagePlugin.EpsImageFile, "_open", forbidden)
    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    cases = refused_files()
    for name, (data, _) in cases.items():
        outcome(name, data)
    outcome.caption_all()
    assert not outcome.loaded, sorted(outcome.loaded)
    for name, (_, named) in cases.items():
        assert named in outcome.refused[name], outcome.refused[name]


def test_pixel_limit_is_checked_from_the_header(tmp_path: Path) -> None:
    """A file over the limit is refused without decoding; the default limit is the one above."""
    path = tmp_path / "big.png"
    path.write_bytes(png_header(8000, 8000))  # 64 MP claimed, 100 bytes of data
    with pytest.raises(ImageLoadError, match=r"big\.png: image is 8000x8000 = 64 megapixels, over the limit of 50"):
        load_image(path)
    assert MAX_PIXELS == 50_000_000


def test_uploads_as_bytes_and_streams(model: Captioner) -> None:
    """The same checks hold for in-memory uploads, named '<upload>'."""
    jpeg = valid_files()["JPEG"]
    assert load_image(jpeg).size == load_image(io.BytesIO(jpeg)).size == (12, 8)
    for source in (EPS, io.BytesIO(EPS)):
        with pytest.raises(ImageLoadError, match=r"^<upload>: EPS format"):
            load_image(source)
    TRIED["uploads"] = 3

