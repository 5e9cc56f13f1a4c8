"""The figures of one caption that `captioner caption` writes on request: its heatmaps, the transformer's head view
and per-head maps (numpy and Pillow, viz/head_views.py), and each word's attention beside Grad-CAM (matplotlib)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from PIL import Image  # noqa: E402

from captioner.core.decode_results import Caption  # noqa: E402
from captioner.evaluation.grounding import upsample  # noqa: E402
from captioner.viz.curves import save_figure  # noqa: E402
from captioner.viz.head_views import head_grid_picture, save_head_view  # noqa: E402
from captioner.viz.overlays import overlay, save_attention_figure, save_picture  # noqa: E402


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
        written["self_attention"], _ = save_head_view(base, caption)
    if request.head_grid is not None:
        written["head_grid"] = save_picture(request.head_grid / f"{stem}_heads{suffix}.png",
                                            head_grid_picture(image, caption))
    if request.gradcam is not None and cams:
        figure = saliency_figure(image, caption, cams, request.layer, request.head)
        (written["gradcam"],) = save_figure(figure, request.gradcam / f"{stem}_gradcam{suffix}.png", dpi=90)
    return written
