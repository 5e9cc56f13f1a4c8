"""Gallery sheets: photographs in a grid, each with captions from several sources beneath it. They
show what a table of scores hides: a stock sentence, a wrong colour, a missed second person."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image, ImageDraw

from captioner.viz.overlays import font, shorten

TILE_SIDE = 256  # px of the photograph's longer side
TEXT_SIZE = 13
GAP = 12


@dataclass(frozen=True)
class GalleryItem:
    image: Image.Image
    title: str  # a line above the photograph (its file name, a score)
    captions: Sequence[tuple[str, str]]  # (source, caption) lines beneath it, in order


def _lines(source: str, caption: str, width_chars: int) -> list[str]:
    """`source: caption`, wrapped to `width_chars` with the continuation indented; Flickr8k's
    tokenised " ." ending dropped, so human and model captions read alike."""
    return (textwrap.wrap(f"{source}: {caption.strip().removesuffix(' .')}", width_chars, subsequent_indent="   ")
            or [f"{source}:"])


def gallery_sheet(items: Sequence[GalleryItem], columns: int = 4, tile_side: int = TILE_SIDE) -> Image.Image:
    """One sheet of `items`, `columns` a row: each photograph letterboxed in a `tile_side` square,
    its title above and its captions beneath, wrapped to the tile's width."""
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
