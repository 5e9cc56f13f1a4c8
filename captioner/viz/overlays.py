"""Attention maps (T, h, w) -> heatmaps over the image: per-word overlays and the sheet of them.
Numpy and Pillow only (a colour lookup and a blend per word), so a sheet costs milliseconds, not
a matplotlib figure per word; the demo, the CLI and evaluation all draw this sheet."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from PIL import Image, ImageChops, ImageDraw, ImageFilter, ImageFont

from captioner.core.files import write_atomically
from captioner.models.caption_result import Caption, upsample

PANEL_SIDE = 216  # px: a panel's longer side (2.4 inches at 90 dpi)
GAP = 12  # px of white between panels: what keeps them apart on the sheet
TITLE_SIZE, HEADING_SIZE = 15, 15  # font sizes in px: a panel's word, the sheet's heading


@functools.lru_cache(maxsize=8)
def colour_table(cmap: str) -> bytes:
    """A matplotlib colormap as a 256-colour palette (RGB bytes), entry floor(x * 256) as the colormap picks."""
    import matplotlib

    return (matplotlib.colormaps[cmap](np.arange(256))[:, :3] * 255).astype(np.uint8).tobytes()  # (256 * 3,)


def overlay(image: Image.Image, heatmap: np.ndarray, alpha: float = 0.55, cmap: str = "jet") -> Image.Image:
    """Blend a (H, W) heatmap, scaled to its own maximum, over the image: the colormap as a
    palette and the blend as Pillow's composite, both in C (within one level of float arithmetic)."""
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


def fit(image: Image.Image, side: int) -> Image.Image:
    """The image scaled, up or down, so that its longer side is `side` px."""
    scale = side / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.convert("RGB").resize(size, Image.Resampling.BILINEAR)


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


def attention_sheet(
    image: Image.Image,
    caption: Caption,
    layer: int = -1,
    head: int | None = None,
    outlines: dict[int, np.ndarray] | None = None,
    columns: int = 5,
    title: str | None = None,
    panel_side: int = PANEL_SIDE,
) -> Image.Image:
    """The image, then each word over its attention map, `columns` panels a row, each word as its
    panel's title and the caption (or `title`) as the heading. `outlines` maps a word position to
    a (H, W) boolean mask of its true region, drawn as a white border on that word's map."""
    picture = fit(image, panel_side)
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


def save_attention_figure(path: str | Path, image: Image.Image, caption: Caption, **options) -> Path:
    """Write `attention_sheet(image, caption, **options)` to `path` (its format from the suffix)."""
    path = Path(path)
    sheet = attention_sheet(image, caption, **options)
    kind = Image.registered_extensions().get(path.suffix.lower(), "PNG")  # the temporary name has no telling suffix
    fastest = {"compress_level": 1} if kind == "PNG" else {}  # photos barely compress more at higher levels
    write_atomically(path, lambda tmp: sheet.save(tmp, format=kind, **fastest))  # a full disk: one StorageError
    return path
