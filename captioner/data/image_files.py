"""The one image loader: a file, bytes or upload -> an upright 8-bit RGB picture, or one `ImageLoadError`.
No torch, so the ONNX runtime (`captioner.deploy`) refuses the same hostile files."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import struct
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from captioner.core.errors import ConfigError, ImageLoadError

# A decompression bomb guard: far above any camera photo, far below what exhausts memory.
MAX_PIXELS = 50_000_000
# The formats read; Pillow's other plugins (EPS runs Ghostscript, most are rarely exercised) are never reached.
SUPPORTED_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
_HEADER_BYTES = 64  # enough for every plugin's signature check


def load_image(source: str | Path | bytes | BinaryIO, max_pixels: int = MAX_PIXELS,
               name: str | None = None) -> Image.Image:
    """An image file as an upright 8-bit RGB picture (first frame, transparency over white), `open_checked`."""
    return open_checked(source, decode_rgb, max_pixels, name)


def decode_rgb(image: Image.Image) -> Image.Image:
    """An opened, checked image decoded as `load_image` returns it: the first frame, upright, RGB."""
    image.seek(0)  # first frame of an animation, first page of a TIFF
    image.load()
    return to_rgb(upright(image))


T = TypeVar("T")


def missing(path: Path) -> str:
    """Why a path names no file, for its one line: no such file, a link to a missing one, or a loop of links."""
    if not path.is_symlink():
        return "no such file"
    try:
        path.resolve(strict=True)
    except RuntimeError:  # Python before 3.13 reports a loop so
        return "a loop of symbolic links"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a loop of symbolic links"
    return f"a link to {os.readlink(path)}, which does not exist"


def open_checked(source: str | Path | bytes | BinaryIO, finish: Callable[[Image.Image], T],
                 max_pixels: int = MAX_PIXELS, name: str | None = None) -> T:
    """`finish(image)` if its header shows a supported format and a size under `max_pixels`, else ImageLoadError."""
    name = name or (str(source) if isinstance(source, (str, Path)) else "<upload>")
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise ImageLoadError(f"{name}: {missing(path)}" if not path.exists() else f"{name}: not a file")
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
                    raise ImageLoadError(f"{name}: image is {width}x{height} = {width * height / 1e6:.0f} megapixels, "
                                         f"over the limit of {max_pixels / 1e6:.0f} (possible decompression bomb)")
                return finish(image)
    except FileNotFoundError:
        raise ImageLoadError(f"{name}: no such file") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        # Pillow's own header check (at 89 MP) fired before ours: the same message as ours.
        found = re.search(r"\((\d+) pixels\)", str(e))
        pixels = f"{int(found.group(1)) / 1e6:.0f} megapixels" if found else "too many pixels"
        raise ImageLoadError(f"{name}: image has {pixels}, over the limit of {max_pixels / 1e6:.0f} (possible "
                             "decompression bomb)") from None
    except MemoryError:
        raise ImageLoadError(f"{name}: too large to decode in memory") from None
    # Pillow's decoders report damaged data with any of these: a bad file, not a bug.
    except (OSError, SyntaxError, ValueError, EOFError, struct.error, IndexError, KeyError, TypeError,
            ZeroDivisionError) as e:
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise ImageLoadError(f"{name}: corrupt or truncated image ({reason})") from None


def open_image(source: str | Path | BinaryIO, name: str | None = None) -> Image.Image:
    """`Image.open` restricted to `SUPPORTED_FORMATS`; another format is named by its signature alone."""
    try:
        return Image.open(source, formats=SUPPORTED_FORMATS)
    except UnidentifiedImageError:
        refused = _describe_refused(source)
    raise ImageLoadError(f"{name or source}: {refused}; supported formats: {', '.join(SUPPORTED_FORMATS)}")


def _describe_refused(source: str | Path | BinaryIO) -> str:
    """'EPS format (by its signature), which this project does not read', or 'not an image file'."""
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
        with contextlib.suppress(Exception):  # a signature check that chokes is no match
            if accept(prefix):
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


ImageInput = str | Path | bytes | Image.Image  # a path, an encoded image file, or a picture


def picture_of(image: ImageInput, position: str | None = None) -> Image.Image:
    """A path, bytes or a PIL image -> an upright RGB picture; `position` ("image 2 of 5") starts its error."""
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


def caption_in_batches(images: ImageInput | Sequence[ImageInput], batch_size: int,
                       caption: Callable[[list[Image.Image]], list], *, n_best: int | None = None,
                       errors: str = "raise", on_picture: Callable[[Image.Image], None] | None = None) -> Any:
    """The batching loop of the torch model and the ONNX runtime: `images` (one or a list) through `caption`; a
    bad image stops a list, naming its place, unless `errors="return"` puts the error in its place."""
    if errors not in ("raise", "return"):
        raise ConfigError(f"caption: errors must be raise or return; got {errors!r}")
    single = not isinstance(images, (list, tuple))
    if single and n_best is not None:
        raise ConfigError("caption: n_best gives several captions per image; pass a list of images")
    items: list[ImageInput] = [images] if single else list(images)  # type: ignore[list-item]
    results: list = []
    for start in range(0, len(items), batch_size):
        loaded: list[Image.Image | ImageLoadError] = []
        for i, item in enumerate(items[start : start + batch_size], start):
            try:
                loaded.append(
                    picture_of(item, None if single or errors == "return" else f"image {i + 1} of {len(items)}"))
            except ImageLoadError as e:
                if errors == "raise":
                    raise
                loaded.append(e)
                continue
            if on_picture is not None:
                on_picture(loaded[-1])
        good = [x for x in loaded if not isinstance(x, ImageLoadError)]
        captions = iter(caption(good) if good else [])
        results += [x if isinstance(x, ImageLoadError) else next(captions) for x in loaded]
    return results[0] if single else results