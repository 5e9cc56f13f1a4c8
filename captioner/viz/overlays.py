"""Attention maps (T, h, w) -> heatmaps over the image, their sheet, and gallery sheets of captioned photographs.
Numpy and Pillow only, so a sheet costs milliseconds, not a matplotlib figure per word."""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageChops, ImageDraw, ImageFilter, ImageFont

from captioner.core.files import write_atomically
from captioner.core.decode_results import Caption
from captioner.evaluation.grounding import upsample

PANEL_SIDE = 216  # px: a panel's longer side (2.4 inches at 90 dpi)
GAP = 12  # px of white between panels: what keeps them apart on the sheet
TITLE_SIZE, HEADING_SIZE = 15, 15  # font sizes in px: a panel's word, the sheet's heading


@functools.lru_cache(maxsize=8)
def colour_table(cmap: str) -> bytes:
    """A matplotlib colormap as a 256-colour palette (RGB bytes), entry floor(x * 256) as the colormap picks."""
    import matplotlib

    return (matplotlib.colormaps[cmap](np.arange(256))[:, :3] * 255).astype(np.uint8).tobytes()  # (256 * 3,)


def overlay(image: Image.Image, heatmap: np.ndarray, alpha: float = 0.55, cmap: str = "jet") -> Image.Image:
    """Blend a (H, W) heatmap, scaled to its own maximum, over the image (palette and composite, in C)."""
    heat = heatmap / max(float(heatmap.max()), 1e-12)  # (H, W) in 0..1
    index = np.minimum(heat * 256, 255).astype(np.uint8)  # (H, W): the colormap's entry
    colours = Image.fromarray(index, "L")
    colours.putpalette(colour_table(cmap))  # now mode P
    weight = (np.sqrt(heat) * (alpha * 255) + 0.5).astype(np.uint8)  # (H, W): the map's faint tail shows through
    return Image.composite(colours.convert("RGB"), image.convert("RGB"), Image.fromarray(weight, "L"))


def word_overlays(image: Image.Image, caption: Caption, layer: int = -1,
                  head: int | None = None) -> list[tuple[str, Image.Image]]:
    """One (word, image with that word's attention) pair per generated word."""
    maps = upsample(caption.heatmaps(layer, head), (image.height, image.width)).numpy()  # (T, H, W)
    return [(word, overlay(image, heat)) for word, heat in zip(caption.words, maps)]


@functools.lru_cache(maxsize=4)
def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Pillow's own font (no system font needed), at `size` px."""
    return ImageFont.load_default(size=size)


def draw_outline(picture: Image.Image, mask: np.ndarray) -> Image.Image:
    """`picture` with the border of a (H, W) boolean region (at any resolution) drawn in white."""
    region = Image.fromarray(mask.astype(np.uint8) * 255).resize(picture.size, Image.Resampling.NEAREST)
    border = ImageChops.difference(region.filter(ImageFilter.MaxFilter(3)),
                                   region.filter(ImageFilter.MinFilter(3)))  # a 2-px ring
    outlined = picture.copy()
    outlined.paste((255, 255, 255), mask=border)
    return outlined


def shorten(text: str, width: int, typeface: ImageFont.FreeTypeFont | ImageFont.ImageFont) -> str:
    """`text`, cut with an ellipsis where it would be wider than `width` px."""
    if typeface.getlength(text) <= width:
        return text
    while text and typeface.getlength(text + "…") > width:
        text = text[:-1]
    return text + "…"


def panel_picture(image: Image.Image, side: int) -> Image.Image:
    """An RGB copy of `image` scaled up or down so that its longer side is `side` px: a panel's maps are drawn at the
    pixels it shows."""
    scale = side / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.convert("RGB").resize(size, Image.Resampling.BILINEAR)


def attention_sheet(image: Image.Image, caption: Caption, layer: int = -1, head: int | None = None,
                    outlines: dict[int, np.ndarray] | None = None, columns: int = 5, title: str | None = None,
                    panel_side: int = PANEL_SIDE) -> Image.Image:
    """The image, then each word over its attention map, `columns` panels a row, under the caption (or `title`);
    `outlines`: word position -> (H, W) boolean mask of its true region, bordered in white."""
    picture = panel_picture(image, panel_side)
    panels = [("input", picture), *word_overlays(picture, caption, layer, head)]
    for position, mask in (outlines or {}).items():
        if position + 1 < len(panels):
            word, shown = panels[position + 1]
            panels[position + 1] = (word, draw_outline(shown, mask))
    title_font, heading_font = font(TITLE_SIZE), font(HEADING_SIZE)
    title_height, heading_height = TITLE_SIZE + 8, HEADING_SIZE + 16
    cell_width, cell_height = picture.width + GAP, title_height + picture.height + GAP
    rows = (len(panels) + columns - 1) // columns
    sheet = Image.new("RGB", (GAP + min(columns, len(panels)) * cell_width, heading_height + rows * cell_height),
                      "white")
    draw = ImageDraw.Draw(sheet)
    heading = shorten(title or f"{caption.text}  (score {caption.score:.2f})", sheet.width - 2 * GAP, heading_font)
    draw.text((sheet.width / 2, heading_height / 2), heading, fill="black", font=heading_font, anchor="mm")
    for i, (word, shown) in enumerate(panels):
        left, top = GAP + (i % columns) * cell_width, heading_height + (i // columns) * cell_height
        label = shorten(word, cell_width, title_font)
        draw.text((left + picture.width / 2, top + title_height / 2), label, fill="black", font=title_font, anchor="mm")
        sheet.paste(shown, (left, top + title_height))
    return sheet


def save_picture(path: str | Path, picture: Image.Image) -> Path:
    """Write `picture` to `path` atomically, its format from the suffix."""
    path = Path(path)
    kind = Image.registered_extensions().get(path.suffix.lower(), "PNG")  # the temporary name has no telling suffix
    # PNG: photos barely compress more at higher levels; JPEG: Pillow's default quality (75) blurs the labels
    encoding = {"PNG": {"compress_level": 1}, "JPEG": {"quality": 95}}.get(kind, {})
    write_atomically(path, lambda tmp: picture.save(tmp, format=kind, **encoding))  # a full disk: one StorageError
    return path


def save_attention_figure(path: str | Path, image: Image.Image, caption: Caption, **options) -> Path:
    """Write `attention_sheet(image, caption, **options)` to `path` (its format from the suffix)."""
    return save_picture(path, attention_sheet(image, caption, **options))


TILE_SIDE = 256  # px of a gallery photograph's longer side
TEXT_SIZE = 13  # px: gallery captions


@dataclass(frozen=True)
class GalleryItem:
    """A photograph of a gallery sheet, its title and captions (what a table of scores hides)."""

    image: Image.Image
    title: str  # a line above the photograph (its file name, a score)
    captions: Sequence[tuple[str, str]]  # (source, caption) lines beneath it, in order


def _lines(source: str, caption: str, width_chars: int) -> list[str]:
    """`source: caption`, wrapped to `width_chars`; Flickr8k's tokenised " ." ending dropped."""
    return (textwrap.wrap(f"{source}: {caption.strip().removesuffix(' .')}", width_chars, subsequent_indent="   ")
            or [f"{source}:"])


def gallery_sheet(items: Sequence[GalleryItem], columns: int = 4, tile_side: int = TILE_SIDE) -> Image.Image:
    """One sheet of `items`, `columns` a row: each photograph in a `tile_side` square, title above, captions below."""
    if not items:
        raise ValueError("a gallery needs at least one item")
    typeface = font(TEXT_SIZE)
    line_height = TEXT_SIZE + 4
    width_chars = max(12, int(tile_side / typeface.getlength("n")))  # wrap by the width of a typical letter
    wrapped = [[line for source, text in item.captions for line in _lines(source, text, width_chars)] for item in items]
    text_height = line_height * (1 + max(map(len, wrapped)))  # the title, then the tallest block of captions
    cell_width, cell_height = tile_side + GAP, text_height + tile_side + GAP
    rows = (len(items) + columns - 1) // columns
    sheet = Image.new("RGB", (GAP + min(columns, len(items)) * cell_width, GAP + rows * cell_height), "white")
    draw = ImageDraw.Draw(sheet)
    for i, (item, lines) in enumerate(zip(items, wrapped)):
        left, top = GAP + (i % columns) * cell_width, GAP + (i // columns) * cell_height
        draw.text((left, top), shorten(item.title, tile_side, typeface), fill=(90, 90, 90), font=typeface)
        picture = item.image.convert("RGB")
        picture.thumbnail((tile_side, tile_side), Image.Resampling.BILINEAR)
        sheet.paste(picture, (left + (tile_side - picture.width) // 2,
                              top + line_height + (tile_side - picture.height) // 2))
        for n, line in enumerate(lines):
            y = top + line_height + tile_side + 4 + n * line_height
            draw.text((left, y), shorten(line, tile_side, typeface), fill="black", font=typeface)
    return sheet
