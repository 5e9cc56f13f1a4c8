"""Attention maps (T, h, w) -> heatmaps over the image: per-word overlays and figures."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from PIL import Image  # noqa: E402

from captioner.core.files import write_atomically  # noqa: E402
from captioner.models.caption import Caption, upsample  # noqa: E402


def overlay(image: Image.Image, heatmap: np.ndarray, alpha: float = 0.55, cmap: str = "jet") -> Image.Image:
    """Blend a (H, W) heatmap, scaled to its own maximum, over the image."""
    heat = heatmap / max(float(heatmap.max()), 1e-12)
    colours = (matplotlib.colormaps[cmap](heat)[..., :3] * 255).astype(np.float32)  # (H, W, 3)
    base = np.asarray(image.convert("RGB"), dtype=np.float32)
    weight = alpha * heat[..., None] ** 0.5  # the faint tail of the map shows the image through
    return Image.fromarray((base * (1 - weight) + colours * weight).astype(np.uint8))


def word_overlays(image: Image.Image, caption: Caption, layer: int = -1, head: int | None = None) -> list[tuple[str, Image.Image]]:
    """One (word, image with that word's attention) pair per generated word."""
    maps = upsample(caption.heatmaps(layer, head), (image.height, image.width)).numpy()  # (T, H, W)
    return [(word, overlay(image, heat)) for word, heat in zip(caption.words, maps)]


def attention_figure(
    image: Image.Image,
    caption: Caption,
    layer: int = -1,
    head: int | None = None,
    outlines: dict[int, np.ndarray] | None = None,
    columns: int = 5,
    title: str | None = None,
) -> Figure:
    """The image, then each word over its attention map. `outlines` maps a word position to a
    (H, W) boolean mask of its true region, drawn as a contour beside the map."""
    panels = word_overlays(image, caption, layer, head)
    rows = 1 + (len(panels)) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(2.4 * columns, 2.5 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    axes.flat[0].imshow(image)
    axes.flat[0].set_title("input", fontsize=10)
    for i, (word, picture) in enumerate(panels):
        ax = axes.flat[i + 1]
        ax.imshow(picture)
        ax.set_title(word, fontsize=12)
        if outlines and i in outlines:
            ax.contour(outlines[i].astype(float), levels=[0.5], colors="white", linewidths=1.2)
    fig.suptitle(title or f"{caption.text}  (score {caption.score:.2f})", fontsize=12)
    fig.tight_layout()
    return fig


def save_attention_figure(path: str | Path, image: Image.Image, caption: Caption, **options) -> Path:
    path = Path(path)
    fig = attention_figure(image, caption, **options)
    try:  # replaced atomically: a full disk is one StorageError naming the file
        write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=90, format=path.suffix.lstrip(".") or "png"))
    finally:
        plt.close(fig)
    return path
