"""The demo page's figures beyond the per-word overlays: the downloadable attention figure and the
transformer views (self-attention head view, a word's layers x heads maps), and the pruning of
the files they leave. `captioner.viz` draws them; this module serves them to the page.

The attention figure is composed with Pillow (`captioner.viz.overlays.attention_sheet`), so
requests draw theirs in parallel; pyplot keeps global state, so the transformer views, drawn with
it, are drawn one at a time.
"""

from __future__ import annotations

import io
import threading
import time
import uuid
from pathlib import Path

from matplotlib.figure import Figure
from PIL import Image

from captioner.apps.demo.choices import maps_label, parse_layer_head, word_position
from captioner.models.caption import Caption
from captioner.viz.overlays import save_attention_figure

FIGURE_LOCK = threading.Lock()  # pyplot's global state: one transformer view at a time


def write_figure(image: Image.Image, caption: Caption, layer: str | int | None, head: str | int | None, figure_dir: Path) -> Path:
    """The downloadable figure: the image, then each word over its map (the CLI's --heatmaps
    figure). The page draws it after showing the caption."""
    layer_index, head_index = parse_layer_head(caption, layer, head)
    maps = maps_label(caption, layer_index, head_index)
    title = f"{caption.text}  (score {caption.score:.2f}{', ' + maps if maps else ''})"
    path = figure_dir / f"attention_{uuid.uuid4().hex[:12]}.png"
    return save_attention_figure(path, image, caption, layer=layer_index, head=head_index, title=title)


def prune(folder: Path, max_age_s: float) -> None:
    """Delete the figures and overlays of `folder` older than `max_age_s`."""
    if not folder.is_dir():
        return
    now = time.time()
    for old in [*folder.glob("attention_*.png"), *folder.glob("overlay_*.jpg")]:
        try:
            if now - old.stat().st_mtime > max_age_s:
                old.unlink()
        except OSError:
            pass  # another request removed it first


def prune_folders(cache: Path, keep: Path, seen_empty: set[Path]) -> set[Path]:
    """Delete the folders directly under `cache` (but `keep`) that are empty now and were empty at
    the previous prune (`seen_empty`); returns the folders empty now that remain, for the next one.

    Gradio keeps each cached file in a folder named by its hash and deletes the file, never the
    folder. Two looks an interval apart tell an emptied folder from one Gradio has just made for a
    file it is about to write. A folder's modification time cannot: every deletion inside it
    renews it, so it would say when Gradio last cleaned, not how old the folder is."""
    empty_now: set[Path] = set()
    for folder in cache.iterdir() if cache.is_dir() else []:
        try:
            if folder == keep or not folder.is_dir() or any(folder.iterdir()):
                continue
            if folder in seen_empty:
                folder.rmdir()  # fails, harmlessly, if a file arrived meanwhile
            else:
                empty_now.add(folder)
        except OSError:
            pass
    return empty_now


def inside_views(
    image: Image.Image, caption: Caption, layer: str | int | None, head: str | int | None, word: str | None
) -> tuple[Image.Image | None, Image.Image | None]:
    """The transformer views of a captioned image: the self-attention head view of the chosen
    layer (the chosen head, or every head and their mean), and the chosen word's cross-attention
    as a layers x heads grid of maps. -> (head view, head grid), (None, None) for the LSTM."""
    from captioner.viz.caption_figures import head_grid_figure, head_view_figure

    if caption.self_attn is None or not caption.words:
        return None, None
    layer_index, head_index = parse_layer_head(caption, layer, head)
    position = word_position(caption, word)
    with FIGURE_LOCK:
        view = figure_image(head_view_figure(caption, [layer_index], None if head_index is None else [head_index]))
        grid = figure_image(head_grid_figure(image, caption, [position]))
    return view, grid


def figure_image(fig: Figure) -> Image.Image:
    """A matplotlib figure as a PIL image (closed after)."""
    import matplotlib.pyplot as plt  # here, after captioner.viz has chosen the Agg backend

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    plt.close(fig)
    buffer.seek(0)
    return Image.open(buffer).convert("RGB")
