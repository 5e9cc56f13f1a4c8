"""The page logic, without Gradio: caption an upload with the CLI's loader and lay out what the page shows
(overlays, score line, conversion notes, refusals, the figure, the transformer views), and prune old pictures."""

from __future__ import annotations

import io
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure
from PIL import Image

from captioner.apps.demo.batcher import CaptionBatcher
from captioner.apps.demo.choices import MEAN, maps_label, parse_layer_head, word_position
from captioner.core.errors import ImageLoadError
from captioner.data.image_files import MAX_PIXELS, load_image, open_image
from captioner.core.decode_results import Caption
from captioner.models.captioner import Captioner
from captioner.models.model_origin import introduce
from captioner.viz.overlays import save_attention_figure, word_overlays

DISPLAY_SIDE = 512  # overlays are drawn on a copy this size at most: a 40 MP photo stays cheap to show
FIGURE_LOCK = threading.Lock()  # pyplot's global state: one transformer view at a time


@dataclass
class Result:
    """One captioned image, kept in the session so a layer/head change redraws without decoding."""

    caption: Caption
    image: Image.Image  # the upright RGB picture, shrunk to DISPLAY_SIDE for the overlays
    model_name: str
    beam_size: int
    seconds: float  # loading and decoding
    notes: list[str]


@dataclass
class PageOutput:
    """What the page shows for one caption (or refusal)."""

    text: str
    score_line: str
    gallery: list[tuple[Image.Image, str]]  # (the image under one word's attention, the word)
    figure: Path | None  # PNG of the whole caption, for download
    note: str  # Markdown: conversions made, or why the upload was refused
    result: Result | None = None


def message(note: str) -> PageOutput:
    """A page with no caption, only `note`."""
    return PageOutput("", "", [], None, note)


def conversion_notes(path: str | Path) -> list[str]:
    """What `load_image` did to make this file 8-bit upright RGB, in words, from its header; never raises."""
    try:
        with open_image(path) as image:
            mode, frames = image.mode, getattr(image, "n_frames", 1)
            transparent = mode in ("RGBA", "LA", "PA") or (mode == "P" and "transparency" in image.info)
            orientation = image.getexif().get(0x0112, 1)
    except Exception:  # noqa: BLE001 - a note is optional; the loader has the last word
        return []
    notes = []
    if frames > 1:
        notes.append(f"An animation of {frames} frames: only its first frame was captioned.")
    if mode.startswith("I;16") or mode in ("I", "F"):
        notes.append(f"A 16-bit image (mode {mode}): converted to 8-bit RGB.")
    elif mode == "CMYK":
        notes.append("A CMYK image: converted to RGB.")
    elif transparent:
        notes.append("Transparent areas were composited over white.")
    elif mode not in ("RGB", "P"):
        notes.append(f"A mode {mode} image: converted to RGB.")
    if orientation not in (1, None):
        notes.append("Turned upright as its EXIF orientation says.")
    return notes


def caption_page(model: Captioner, model_name: str, upload: str | Path | None, beam_size: int, max_length: int,
                 layer: str | int | None = None, head: str | int | None = MEAN, figure_dir: Path | None = None,
                 max_pixels: int = MAX_PIXELS, batcher: CaptionBatcher | None = None) -> PageOutput:
    """Caption an upload and draw its heatmaps (and figure into `figure_dir`); a refused file is its one line, by
    its own name rather than the server's temporary path."""
    if upload is None or str(upload) == "":
        return message("Upload an image or pick an example first.")
    path = Path(upload)
    started = time.perf_counter()
    try:
        image = load_image(path, max_pixels)
    except ImageLoadError as e:
        return message(f"**Could not caption this file.** {str(e).replace(str(path), path.name)}")
    self_attention = model.decoder.has_self_attention  # transformers: kept from this pass, for the head view
    options = {"beam_size": int(beam_size), "max_length": int(max_length), "self_attention": self_attention}
    if batcher is None:
        introduce(model.origins, image)
    caption = batcher.caption(model, image, **options) if batcher is not None else model.caption(image, **options)
    shown = image.copy()
    shown.thumbnail((DISPLAY_SIDE, DISPLAY_SIDE))
    notes = conversion_notes(path)
    if not caption.finished:
        notes.append(f"The caption reached the maximum length ({int(max_length)} words) before the model ended it.")
    result = Result(caption, shown, model_name, int(beam_size), time.perf_counter() - started, notes)
    return render_page(result, layer, head, figure_dir)


def render_page(result: Result, layer: str | int | None, head: str | int | None,
                figure_dir: Path | None = None) -> PageOutput:
    """Overlays (and the figure, with `figure_dir`) for one layer/head choice of a captioned image."""
    caption = result.caption
    layer_index, head_index = parse_layer_head(caption, layer, head)
    gallery = [(picture, word) for word, picture in word_overlays(result.image, caption, layer_index, head_index)]
    maps = maps_label(caption, layer_index, head_index)
    score_line = (f"score {caption.score:.3f} · log-probability {caption.logprob:.2f} · {len(caption.words)} words · "
                  f"beam {result.beam_size} · {result.model_name}{' · ' + maps if maps else ''} · "
                  f"captioned in {result.seconds:.2f} s")
    note = " ".join(result.notes)
    if not caption.words:
        note = (note + " The model ended the caption at once: there is no word to show.").strip()
    figure = write_figure(result.image, caption, layer, head, figure_dir) if figure_dir is not None else None
    return PageOutput(caption.text, score_line, gallery, figure, note, result)


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
    """Delete the folders under `cache` (but `keep`) empty now and at the last prune (`seen_empty`: an emptied
    folder, not a new one); returns those empty now."""
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
