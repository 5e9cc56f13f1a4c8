"""The page logic, without Gradio: the menus and the check of a /caption request against them (Gradio's range checks
guard the page, not the API), captioning an upload with the CLI's loader, laying out what the page shows, pruning."""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from captioner.apps.demo.batcher import CaptionBatcher
from captioner.core.decode_schema import OPTIONS as DECODE_OPTIONS
from captioner.core.errors import ImageLoadError, RequestError
from captioner.data.image_files import MAX_PIXELS, load_image, open_image
from captioner.core.decode_results import Caption
from captioner.models.captioner import Captioner
from captioner.models.model_origin import introduce
from captioner.viz.head_views import head_grid_picture, head_view_layout, head_view_picture
from captioner.viz.overlays import save_attention_figure, word_overlays

DISPLAY_SIDE = 512  # overlays are drawn on a copy this size at most: a 40 MP photo stays cheap to show
MEAN = "mean"  # the head choice that averages the heads
# The sliders' ranges: what core/decode_schema.py lets a public page serve.
MAX_BEAM = int(DECODE_OPTIONS["beam_size"].served.le)  # type: ignore[union-attr]
MAX_LENGTH = int(DECODE_OPTIONS["max_length"].served.le)  # type: ignore[union-attr]


def attention_choices(model: Captioner) -> tuple[list[str], list[str]]:
    """Dropdown choices: layers "1".."L" (default the last) and heads "mean", "1".."H"."""
    layers, heads = model.attention_shape()
    return [str(i + 1) for i in range(layers)], [MEAN, *(str(i + 1) for i in range(heads))]


def menus(model: Captioner) -> tuple[dict[str, Any], dict[str, Any]]:
    """Layer and head menu settings (last layer, mean of heads); hidden for one map per word."""
    layers, heads = attention_choices(model)
    visible = len(layers) > 1 or len(heads) > 2
    return ({"choices": layers, "value": layers[-1], "visible": visible},
            {"choices": heads, "value": MEAN, "visible": visible})


def parse_layer_head(caption: Caption, layer: str | int | None, head: str | int | None) -> tuple[int, int | None]:
    """Dropdown values -> (layer index, head index or None for the mean), clamped to the caption's maps."""
    num_layers, num_heads = caption.attn.shape[1:3]
    try:
        layer_index = min(max(int(layer) - 1, 0), num_layers - 1)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        layer_index = num_layers - 1
    try:
        head_index = int(head) - 1  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return layer_index, None
    return layer_index, head_index if 0 <= head_index < num_heads else None


def maps_label(caption: Caption, layer: int, head: int | None) -> str:
    """'layer 2, head 1' for a multi-layer or multi-head decoder; '' when there is one map a word."""
    if caption.attn.shape[1] == 1 and caption.attn.shape[2] == 1:
        return ""
    return f"layer {layer + 1}, " + ("mean of heads" if head is None else f"head {head + 1}")


def word_choices(caption: Caption) -> list[str]:
    """The word menu: "1: a", "2: red", ... (numbered, since a word can occur twice)."""
    return [f"{i + 1}: {w}" for i, w in enumerate(caption.words)]


def word_position(caption: Caption, word: str | None) -> int:
    """A word menu value "3: circle" -> 2; anything else -> the first word."""
    try:
        position = int(str(word).split(":", 1)[0]) - 1
    except ValueError:
        return 0
    return position if 0 <= position < len(caption.words) else 0


@dataclass(frozen=True)
class Request:
    """A checked /caption request: values the page's own controls could have sent."""

    model_name: str
    beam_size: int
    max_length: int
    layer: str | None
    head: str


def served(name: str, value: Any) -> Any:
    """A decoding option's value within what the page serves (3.0 is 3; 2.5, NaN, True, "3" are a RequestError)."""
    option = DECODE_OPTIONS[name]
    if not option.allows(value, served=True):
        raise RequestError(option.refusal(value, served=True))
    return option.converted(value)


def menu_value(value: Any) -> str | None:
    """A dropdown value as the menu's string ("2" for 2), None for no choice."""
    if value is None or value == "":
        return None
    return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else repr(value)


def check_request(models: dict[str, Captioner], model_name: Any, beam_size: Any, max_length: Any, layer: Any,
                  head: Any) -> Request:
    """Every value of a /caption request checked against what the page offers, or `RequestError` naming it."""
    if model_name in (None, ""):
        model_name = next(iter(models))
    if not isinstance(model_name, str) or model_name not in models:
        raise RequestError(f"unknown model {str(model_name)[:80]!r}: choose one of the menu's models")
    beam, length = served("beam_size", beam_size), served("max_length", max_length)
    layers, heads = attention_choices(models[model_name])
    layer, head = menu_value(layer), menu_value(head) or MEAN
    if layer is not None and layer not in layers:
        raise RequestError(f"decoder layer must be one of {', '.join(layers)} for this model, got {layer[:20]!r}")
    if head not in heads:
        raise RequestError(f"attention head must be one of {', '.join(heads)} for this model, got {head[:20]!r}")
    return Request(model_name, beam, length, layer, head)


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
    score_line = (f"score {caption.score:.3f} · log-probability {caption.logprob:.2f} · "
                  f"{len(caption.words)} words · beam {result.beam_size} · {result.model_name}"
                  f"{' · ' + maps if maps else ''} · "
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
    path = figure_dir / f"attention_{uuid.uuid4().hex[:12]}.jpg"  # PNG: 17x the time (bench_demo_load)
    return save_attention_figure(path, image, caption, layer=layer_index, head=head_index, title=title)


def prune(folder: Path, max_age_s: float) -> None:
    """Delete the figures, overlays and transformer views of `folder` older than `max_age_s`."""
    now = time.time()
    for old in [path for kind in ("attention", "overlay", "view") for path in folder.glob(f"{kind}_*.jpg")]:
        with contextlib.suppress(OSError):  # another request removed it first
            if now - old.stat().st_mtime > max_age_s:
                old.unlink()


def prune_folders(cache: Path, keep: Path, seen_empty: set[Path]) -> set[Path]:
    """Delete the folders under `cache` (but `keep`) empty now and at the last prune (`seen_empty`: an emptied
    folder, not a new one); returns those empty now."""
    empty_now: set[Path] = set()
    for folder in cache.iterdir() if cache.is_dir() else []:
        with contextlib.suppress(OSError):
            if folder == keep or not folder.is_dir() or any(folder.iterdir()):
                continue
            if folder in seen_empty:
                folder.rmdir()  # fails, harmlessly, if a file arrived meanwhile
            else:
                empty_now.add(folder)
    return empty_now


def inside_views(image: Image.Image, caption: Caption, layer: str | int | None, head: str | int | None,
                 word: str | None) -> tuple[Image.Image | None, Image.Image | None]:
    """(the chosen layer's self-attention head view, the chosen word's layers x heads maps), numbered as the
    menus count; LSTM: (None, None)."""
    if caption.self_attn is None or not caption.words:
        return None, None
    layer_index, head_index = parse_layer_head(caption, layer, head)
    heads = None if head_index is None else [head_index]
    view = head_view_picture(head_view_layout(caption, [layer_index], heads, first=1))
    return view, head_grid_picture(image, caption, [word_position(caption, word)], first=1)
