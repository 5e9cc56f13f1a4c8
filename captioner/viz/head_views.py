"""The transformer's views inside one caption, drawn with numpy and Pillow: the self-attention head view (a picture
and the same layout as SVG) and each word's cross-attention per layer and head. Milliseconds, where the matplotlib
figures they replace cost the demo about 400 ms of CPU a caption (docs/results/bench_demo_pictures.json)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

import torch
from PIL import Image, ImageDraw

from captioner.core.decode_results import Caption
from captioner.core.errors import CaptionerError
from captioner.core.files import write_atomically
from captioner.evaluation.grounding import upsample
from captioner.viz.overlays import font, overlay, panel_picture, save_picture, shorten

MARGIN, GAP = 12, 14  # px: around the picture, between panels
HEADING_SIZE, TITLE_SIZE, WORD_SIZE = 15, 13, 12  # px: the picture's heading, a panel's title, a word
PANEL_WIDTH, WORD_WIDTH, ROW = 200, 72, 18  # px: a head view panel, its words' columns, the pitch of its rows
GRID_PANEL_SIDE, LABEL_WIDTH = 140, 84  # px: a per-head map's longer side, the word and layer labels left of a row
SUPERSAMPLE = 2  # the head view is drawn at twice its size and reduced: Pillow's lines are not antialiased


@dataclass(frozen=True)
class Text:
    x: float
    y: float
    text: str
    size: int
    anchor: str  # Pillow's two letters: horizontal l/m/r, then m (the middle of the line)


@dataclass(frozen=True)
class Line:
    """A line from word t (left) to input j (right), as strong as the weight w."""

    start: tuple[float, float]
    end: tuple[float, float]
    rgb: tuple[int, int, int]
    weight: float

    @property
    def alpha(self) -> float:
        return min(1.0, 0.15 + 0.85 * self.weight)

    @property
    def width(self) -> float:  # px
        return 0.4 + 3.6 * self.weight


@dataclass
class Layout:
    """What a head view shows, in px, for both the picture and the SVG: its texts and lines."""

    width: int
    height: int
    texts: list[Text] = field(default_factory=list)
    panels: list[list[Line]] = field(default_factory=list)  # each panel's lines, in the panels' order


@functools.lru_cache(maxsize=1)
def head_colours() -> tuple[tuple[int, int, int], ...]:
    """matplotlib's tab10, head h in colour h % 10 (the mean in black), as 0-255 RGB."""
    import matplotlib

    return tuple(tuple(round(255 * c) for c in rgb) for rgb in matplotlib.colormaps["tab10"].colors)


def head_view_layout(caption: Caption, layers: list[int] | None = None, heads: list[int] | None = None,
                     first: int = 0) -> Layout:
    """bertviz's head view of the decoder's self-attention: a row of panels per layer, one per head and one for
    their mean; in each, a line from every word (left) to each input it weighs over 0.02 (right: <bos> and the
    words before it). `first`: the number the first layer and head are called (the demo's menus count from 1)."""
    if caption.self_attn is None:
        raise CaptionerError("this caption has no self-attention weights: only transformer decoders have them")
    weights = torch.as_tensor(caption.self_attn)  # (T, L, H, T)
    T, L, H = weights.shape[:3]
    layers = list(range(L)) if layers is None else layers
    heads = list(range(H)) if heads is None else heads
    left, right = list(caption.words), ["<bos>", *caption.words[:-1]]
    columns = len(heads) + (1 if len(heads) > 1 else 0)
    panel_height = TITLE_SIZE + 12 + T * ROW
    heading_height = HEADING_SIZE + 18
    width = 2 * MARGIN + columns * PANEL_WIDTH + (columns - 1) * GAP
    layout = Layout(width, heading_height + len(layers) * (panel_height + GAP) + MARGIN - GAP)
    heading = shorten(f"self-attention: {caption.text}", width - 2 * MARGIN, font(HEADING_SIZE))
    layout.texts.append(Text(width / 2, heading_height / 2, heading, HEADING_SIZE, "mm"))
    for r, layer in enumerate(layers):
        shown = [(weights[:, layer, h], head_colours()[h % 10], f"layer {layer + first}, head {h + first}")
                 for h in heads]
        if len(heads) > 1:
            shown.append((weights[:, layer, heads].mean(dim=1), (0, 0, 0), f"layer {layer + first}, mean"))
        for c, (w, rgb, title) in enumerate(shown):  # w: (T, T)
            x, y = MARGIN + c * (PANEL_WIDTH + GAP), heading_height + r * (panel_height + GAP)
            layout.texts.append(Text(x + PANEL_WIDTH / 2, y + TITLE_SIZE / 2, title, TITLE_SIZE, "mm"))
            layout.panels.append(_panel(layout.texts, w.tolist(), left, right, rgb, x, y + TITLE_SIZE + 12))
    return layout


def _panel(texts: list[Text], rows: list[list[float]], left: list[str], right: list[str], rgb: tuple[int, int, int],
           x: float, top: float) -> list[Line]:
    """One panel's words (appended to `texts`) and its lines; rows: (T, T) weights, causal."""
    typeface = font(WORD_SIZE)
    x_left, x_right = x + WORD_WIDTH, x + PANEL_WIDTH - WORD_WIDTH  # the words' inner edges
    lines = []
    for t in range(len(left)):
        y = top + (t + 0.5) * ROW
        texts.append(Text(x_left - 3, y, shorten(left[t], WORD_WIDTH - 3, typeface), WORD_SIZE, "rm"))
        texts.append(Text(x_right + 3, y, shorten(right[t], WORD_WIDTH - 3, typeface), WORD_SIZE, "lm"))
        for j in range(t + 1):  # causal: nothing after t carries weight
            if rows[t][j] > 0.02:
                lines.append(Line((x_left + 2, y), (x_right - 2, top + (j + 0.5) * ROW), rgb, rows[t][j]))
    return lines


def head_view_picture(layout: Layout) -> Image.Image:
    """The layout drawn: the lines blended over white at twice the size and reduced (Pillow's lines are not
    antialiased), then the words, each rendered once and stamped wherever it stands (its text is antialiased)."""
    s = SUPERSAMPLE
    canvas = Image.new("RGB", (layout.width * s, layout.height * s), "white")
    draw = ImageDraw.Draw(canvas, "RGBA")  # RGBA fills blend into the picture
    for line in (line for panel in layout.panels for line in panel):
        end_points = [line.start[0] * s, line.start[1] * s, line.end[0] * s, line.end[1] * s]
        draw.line(end_points, fill=(*line.rgb, round(255 * line.alpha)), width=max(1, round(line.width * s)))
    picture = canvas.reduce(s)
    for text in layout.texts:
        stamp, (left, top) = _stamp(text.text, text.size, text.anchor)
        picture.paste((0, 0, 0), (round(text.x + left), round(text.y + top)), mask=stamp)
    return picture


@functools.lru_cache(maxsize=1024)
def _stamp(text: str, size: int, anchor: str) -> tuple[Image.Image, tuple[int, int]]:
    """`text` rendered as a coverage mask, and where its corner lies from the anchor point."""
    typeface = font(size)
    left, top, right, bottom = typeface.getbbox(text, anchor=anchor)
    stamp = Image.new("L", (max(1, right - left), max(1, bottom - top)), 0)
    ImageDraw.Draw(stamp).text((-left, -top), text, fill=255, font=typeface, anchor=anchor)
    return stamp, (left, top)


def head_view_svg(layout: Layout) -> str:
    """The layout as an SVG document: the same texts and lines, to zoom into or edit."""
    anchors = {"l": "start", "m": "middle", "r": "end"}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{layout.width}" height="{layout.height}" '
             f'viewBox="0 0 {layout.width} {layout.height}" font-family="DejaVu Sans, Arial, sans-serif">',
             '<rect width="100%" height="100%" fill="white"/>']
    for line in (line for panel in layout.panels for line in panel):
        parts.append(f'<line x1="{line.start[0]:.1f}" y1="{line.start[1]:.1f}" x2="{line.end[0]:.1f}" '
                     f'y2="{line.end[1]:.1f}" stroke="rgb{line.rgb}" stroke-opacity="{line.alpha:.3f}" '
                     f'stroke-width="{line.width:.2f}"/>')
    for text in layout.texts:
        parts.append(f'<text x="{text.x:.1f}" y="{text.y:.1f}" font-size="{text.size}" '
                     f'text-anchor="{anchors[text.anchor[0]]}" dominant-baseline="central">{escape(text.text)}</text>')
    return "\n".join([*parts, "</svg>\n"])


def save_head_view(base: str | Path, caption: Caption) -> tuple[Path, Path]:
    """Write the head view of every layer and head to base.png (to look at) and base.svg (to zoom into)."""
    layout = head_view_layout(caption)
    png, svg = Path(f"{base}.png"), Path(f"{base}.svg")
    save_picture(png, head_view_picture(layout))
    write_atomically(svg, lambda tmp: tmp.write_text(head_view_svg(layout), encoding="utf-8"))
    return png, svg


def head_grid_picture(image: Image.Image, caption: Caption, positions: list[int] | None = None,
                      first: int = 0) -> Image.Image:
    """Each word's cross-attention as a layers x heads (+ their mean) grid of small maps over the image, the
    words stacked; `first` as in `head_view_layout`."""
    positions = list(range(len(caption.words))) if positions is None else positions
    attn = torch.as_tensor(caption.attn)  # (T, L, H, h, w)
    L, H = attn.shape[1:3]
    columns = H + (1 if H > 1 else 0)
    small = panel_picture(image, GRID_PANEL_SIDE)
    heading_height, title_height = HEADING_SIZE + 18, TITLE_SIZE + 8
    cell_width, cell_height = small.width + GAP // 2, small.height + GAP // 2
    width = 2 * MARGIN + LABEL_WIDTH + columns * cell_width
    height = heading_height + title_height + len(positions) * L * cell_height + (len(positions) - 1) * GAP + MARGIN
    picture = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(picture)
    heading = shorten(f"cross-attention per layer and head: {caption.text}", width - 2 * MARGIN, font(HEADING_SIZE))
    draw.text((width / 2, heading_height / 2), heading, fill="black", font=font(HEADING_SIZE), anchor="mm")
    x0, top = MARGIN + LABEL_WIDTH, heading_height + title_height
    for c in range(columns):
        title = "mean" if c == H else f"head {c + first}"
        draw.text((x0 + c * cell_width + small.width / 2, heading_height + title_height / 2), title, fill="black",
                  font=font(TITLE_SIZE), anchor="mm")
    for i, t in enumerate(positions):
        maps = attn[t]  # (L, H, h, w)
        if H > 1:
            maps = torch.cat([maps, maps.mean(dim=1, keepdim=True)], dim=1)  # (L, H+1, h, w)
        pictures = upsample(maps.flatten(0, 1), (small.height, small.width)).numpy()  # (L*(H+1), h', w')
        for layer in range(L):
            y = top + (i * L + layer) * cell_height + i * GAP
            label = f"{shorten(caption.words[t], LABEL_WIDTH - 8, font(WORD_SIZE))}\nlayer {layer + first}"
            draw.multiline_text((x0 - 8, y + small.height / 2), label, fill="black", font=font(WORD_SIZE),
                                anchor="rm", align="right")
            for c in range(columns):
                picture.paste(overlay(small, pictures[layer * columns + c]), (x0 + c * cell_width, y))
    return picture
