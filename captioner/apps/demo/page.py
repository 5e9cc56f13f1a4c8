"""The page logic, without Gradio (so tested and usable without a server): caption an uploaded file
with the CLI's loader and beam search, and lay out what the page shows: per-word overlays, the score
line, notes on what the loader did to an unusual file, clear messages for files it refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from captioner.apps.demo.batcher import CaptionBatcher
from captioner.apps.demo.choices import MEAN, maps_label, parse_layer_head
from captioner.apps.demo.page_figures import write_figure
from captioner.core.errors import ImageLoadError
from captioner.data.image_files import MAX_PIXELS, load_image, open_image
from captioner.models.caption_result import Caption
from captioner.models.captioner import Captioner
from captioner.models.model_origin import introduce
from captioner.viz.overlays import word_overlays

# overlays are drawn on a copy this size at most: the gallery's preview, and a 40 MP photo stays cheap to show
DISPLAY_SIDE = 512


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
    text: str
    score_line: str
    gallery: list[tuple[Image.Image, str]]  # (the image under one word's attention, the word)
    figure: Path | None  # PNG of the whole caption, for download
    note: str  # Markdown: conversions made, or why the upload was refused
    result: Result | None = None


def message(note: str) -> PageOutput:
    """A page with no caption, only `note`."""
    return PageOutput("", "", [], None, note)


def refusal(reason: str) -> PageOutput:
    return message(f"**Could not caption this file.** {reason}")


def conversion_notes(path: str | Path) -> list[str]:
    """What `load_image` did to make this file 8-bit upright RGB, in words, from its header alone (read by
    the loader's own opener); never raises (the loader reports unreadable files)."""
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
    """Caption an uploaded file and draw its heatmaps (and its figure into `figure_dir`, if given). A file
    the loader refuses gives its one-line reason, by the file's own name rather than the server's temporary
    path. With a `batcher`, the decoding is batched with the other requests it serves meanwhile."""
    if upload is None or str(upload) == "":
        return message("Upload an image or pick an example first.")
    path = Path(upload)
    started = time.perf_counter()
    try:
        image = load_image(path, max_pixels)
    except ImageLoadError as e:
        return refusal(str(e).replace(str(path), path.name))
    # Transformers keep their self-attention from this same pass, for the head view.
    self_attention = model.decoder.has_self_attention
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
