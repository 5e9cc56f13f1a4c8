"""The demo page's figures beyond the overlays, and their pruning: the downloadable attention figure
(Pillow: requests draw in parallel) and the transformer views (pyplot's global state: one at a time).
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
from captioner.models.caption_result import Caption
from captioner.viz.overlays import save_attention_figure

FIGURE_LOCK = threading.Lock()  # pyplot's global state: one transformer view at a time


def write_figure(image: Image.Image, caption: Caption, layer: str | int | None, head: str | int | None,
                 figure_dir: Path) -> Path:
    """The downloadable figure, drawn after the caption is shown: the CLI's --heatmaps figure."""
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
    """Delete the folders under `cache` (but `keep`) empty now and at the previous prune (`seen_empty`); returns
    those empty now. Two looks apart tell an emptied folder (Gradio deletes files, not folders) from a new one."""
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


def inside_views(image: Image.Image, caption: Caption, layer: str | int | None, head: str | int | None,
                 word: str | None) -> tuple[Image.Image | None, Image.Image | None]:
    """(the chosen layer's self-attention head view, the chosen word's layers x heads maps); LSTM: (None, None)."""
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
