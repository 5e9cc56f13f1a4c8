"""Matplotlib figures inside one caption: the self-attention head view, cross-attention per layer and head,
attention beside Grad-CAM."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from PIL import Image  # noqa: E402

from captioner.core.errors import CaptionerError  # noqa: E402
from captioner.core.decode_results import Caption  # noqa: E402
from captioner.evaluation.grounding import upsample  # noqa: E402
from captioner.viz.curves import save_figure  # noqa: E402
from captioner.viz.overlays import overlay, save_attention_figure  # noqa: E402

HEAD_COLOURS = plt.get_cmap("tab10")
# px: the longer side of the picture under a head grid's maps. A panel shows about 130 px of it at the 90 dpi
# the CLI saves at (80 in the demo): drawn at a 512 px photo's size, the maps cost 4x the pixels for nothing.
GRID_PICTURE_SIDE = 256


def _draw_head_view(ax, weights: torch.Tensor, left: list[str], right: list[str], colour, title: str) -> None:
    """weights (T, T): row t's attention over the inputs; a line per (t, j), strength the weight, the lines one
    collection (an artist per line made the panel's drawing most of a head view's time)."""
    T = len(left)
    ax.set_xlim(-0.9, 1.9)
    ax.set_ylim(T - 0.5, -0.8)
    ax.axis("off")
    ax.set_title(title, fontsize=9)
    rgb, rows = to_rgb(colour), weights.tolist()  # rows: (T, T) floats
    segments, colours, widths = [], [], []
    for t in range(T):
        ax.text(0, t, left[t], ha="right", va="center", fontsize=8)
        ax.text(1, t, right[t], ha="left", va="center", fontsize=8)
        for j in range(t + 1):  # causal: nothing after t carries weight
            w = rows[t][j]
            if w > 0.02:
                segments.append([(0.05, t), (0.95, j)])
                colours.append((*rgb, min(1.0, 0.15 + 0.85 * w)))
                widths.append(0.3 + 3 * w)
    ax.add_collection(LineCollection(segments, colors=colours, linewidths=widths, zorder=2))


def head_view_figure(caption: Caption, layers: list[int] | None = None, heads: list[int] | None = None) -> Figure:
    """bertviz's head view of the decoder's self-attention: a panel per (layer, head) and per layer's mean."""
    if caption.self_attn is None:
        raise CaptionerError("this caption has no self-attention weights: only transformer decoders have them")
    weights = caption.self_attn  # (T, L, H, T)
    L, H = weights.shape[1:3]
    layers = list(range(L)) if layers is None else layers
    heads = list(range(H)) if heads is None else heads
    # Left: the word each step produced; right: the input each position held (<bos> and the words before t).
    left, right = list(caption.words), ["<bos>", *caption.words[:-1]]
    columns = len(heads) + (1 if len(heads) > 1 else 0)
    height = 0.9 + 0.24 * len(left)
    fig, axes = plt.subplots(len(layers), columns, figsize=(2.3 * columns, height * len(layers)), squeeze=False)
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            _draw_head_view(axes[r, c], weights[:, layer, head], left, right, HEAD_COLOURS(head % 10),
                            f"layer {layer}, head {head}")
        if len(heads) > 1:
            mean = weights[:, layer, heads].mean(dim=1)  # (T, T)
            _draw_head_view(axes[r, -1], mean, left, right, "black", f"layer {layer}, mean")
    fig.suptitle(f"self-attention: {caption.text}", fontsize=10)
    fig.tight_layout()
    return fig


def head_grid_figure(image: Image.Image, caption: Caption, positions: list[int] | None = None) -> Figure:
    """Each word's cross-attention as a layers x heads(+mean) grid of small maps, the words stacked."""
    positions = list(range(len(caption.words))) if positions is None else positions
    attn = caption.attn  # (T, L, H, h, w)
    L, H = attn.shape[1:3]
    columns = H + (1 if H > 1 else 0)
    rows = L * len(positions)
    fig, axes = plt.subplots(rows, columns, figsize=(1.45 * columns + 0.5, 1.5 * rows + 0.4), squeeze=False)
    image = image.copy()
    image.thumbnail((GRID_PICTURE_SIDE, GRID_PICTURE_SIDE))  # smaller only; the panels' aspect kept
    for i, t in enumerate(positions):
        maps = attn[t]  # (L, H, h, w)
        if H > 1:
            maps = torch.cat([maps, maps.mean(dim=1, keepdim=True)], dim=1)  # (L, H+1, h, w)
        pictures = upsample(maps.flatten(0, 1), (image.height, image.width)).numpy()  # (L*(H+1), H_img, W_img)
        for layer in range(L):
            for c in range(columns):
                ax = axes[i * L + layer, c]
                ax.imshow(overlay(image, pictures[layer * columns + c]))
                ax.set(xticks=[], yticks=[])
                if i * L + layer == 0:
                    ax.set_title("mean" if c == H else f"head {c}", fontsize=9)
                if c == 0:
                    ax.set_ylabel(f"{caption.words[t]}\nlayer {layer}", fontsize=9)
    fig.suptitle(f"cross-attention per layer and head: {caption.text}", fontsize=10)
    fig.tight_layout()
    return fig


def saliency_figure(image: Image.Image, caption: Caption, cams: dict[int, torch.Tensor], layer: int = -1,
                    head: int | None = None, columns: int = 8) -> Figure:
    """For each word: its attention map (top) above its Grad-CAM map (bottom), over the image."""
    positions = sorted(cams)
    columns = max(1, min(columns, len(positions)))
    size = (image.height, image.width)
    attention = upsample(caption.heatmaps(layer, head)[positions], size).numpy()  # (W, H, W)
    gradcam = upsample(torch.stack([cams[p] for p in positions]), size).numpy()  # (W, H, W)
    blocks = (len(positions) + columns - 1) // columns
    fig, axes = plt.subplots(2 * blocks, columns, figsize=(1.7 * columns, 3.6 * blocks + 0.4), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, p in enumerate(positions):
        top, bottom = axes[2 * (i // columns), i % columns], axes[2 * (i // columns) + 1, i % columns]
        top.imshow(overlay(image, attention[i]))
        top.set_title(caption.words[p], fontsize=10)
        bottom.imshow(overlay(image, gradcam[i]))
        for ax, label in ((top, "attention"), (bottom, "Grad-CAM")) if i % columns == 0 else ():
            ax.text(-0.08, 0.5, label, transform=ax.transAxes, rotation=90, ha="right", va="center", fontsize=9)
    fig.suptitle(f"attention vs Grad-CAM: {caption.text}", fontsize=10)
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class FigureRequest:
    """The figures wanted for each caption, by folder (None: not wanted), and the maps' layer and head."""

    heatmaps: Path | None = None  # the image, then every word over its attention map
    self_attention: Path | None = None  # the head view, PNG and SVG (decoders with self-attention)
    head_grid: Path | None = None  # every word's cross-attention per layer and head
    gradcam: Path | None = None  # every word's attention above its Grad-CAM (needs the cams)
    layer: int = -1
    head: int | None = None

    @property
    def per_word(self) -> bool:
        """Whether any figure asked for draws the words one by one (none can for an empty caption)."""
        return any(folder is not None for folder in (self.self_attention, self.head_grid, self.gradcam))


def save_caption_figures(image: Image.Image, caption: Caption, request: FigureRequest, stem: str, suffix: str = "",
                         cams: dict[int, torch.Tensor] | None = None) -> dict[str, Path]:
    """Write the figures `request` asks for, named stem_KIND+suffix ("photo_heads_2.png"); their paths by kind.
    `cams`: word position -> (h, w) Grad-CAM map."""
    written: dict[str, Path] = {}
    if request.heatmaps is not None:
        written["heatmaps"] = save_attention_figure(request.heatmaps / f"{stem}_attention{suffix}.png", image,
                                                    caption, layer=request.layer, head=request.head)
    if not caption.words:
        return written
    if request.self_attention is not None:
        base = request.self_attention / f"{stem}_self_attention{suffix}"  # PNG to look at, SVG to zoom into
        written["self_attention"], _ = save_figure(head_view_figure(caption), f"{base}.png", f"{base}.svg", dpi=90)
    if request.head_grid is not None:
        figure = head_grid_figure(image, caption)
        (written["head_grid"],) = save_figure(figure, request.head_grid / f"{stem}_heads{suffix}.png", dpi=90)
    if request.gradcam is not None and cams:
        figure = saliency_figure(image, caption, cams, request.layer, request.head)
        (written["gradcam"],) = save_figure(figure, request.gradcam / f"{stem}_gradcam{suffix}.png", dpi=90)
    return written
