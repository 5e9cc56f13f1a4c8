"""The Gradio demo: caption an image and show, word by word, where the model looked.

Inference goes through the same loader, transform and beam search as the CLI (`load_image`, then
`Captioner.caption`); this module only adds presentation: overlays, a figure to download, notes
about what the loader did to an unusual file, and clear messages for files it refused.

The page logic is plain functions (`caption_page`, `render_page`) that the Gradio callbacks wrap,
so it is tested without a server. `serve()` is what `captioner demo` and `demo/app.py` run.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The demo must start offline: no telemetry, no version check (both are network calls at startup).
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
from PIL import Image  # noqa: E402

from captioner.core.config import Config, config_from_dict, load_config  # noqa: E402
from captioner.core.errors import CaptionerError, ImageLoadError, RequestError  # noqa: E402
from captioner.data.datasets import load_split  # noqa: E402
from captioner.data.images import MAX_PIXELS, load_image, open_image  # noqa: E402
from captioner.models.caption import Caption  # noqa: E402
from captioner.models.captioner import Captioner  # noqa: E402
from captioner.models.checkpoint import checkpoint_config, load_captioner  # noqa: E402
from captioner.viz.overlays import save_attention_figure, word_overlays  # noqa: E402

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path("configs/shapes_lstm.yaml")  # the quickstart's model, relative to the project folder
MAX_FILE_SIZE = "10mb"  # uploads above this are refused by the server before any decoding
DISPLAY_SIDE = 640  # overlays are drawn on a copy this size at most: a 40 MP photo stays cheap to show
QUEUE_SIZE = 64  # waiting requests beyond this are told the queue is full
MEAN = "mean"  # the head choice that averages the heads
# The sliders' ranges, checked again in the callback: Gradio's own range check is the page's,
# not the project's, and one request with a beam of 10,000 would hold the server for everyone.
MAX_BEAM = 10
MAX_LENGTH = 60

# pyplot keeps global state; figures are drawn one at a time even when requests run in parallel.
_FIGURE_LOCK = threading.Lock()


# --- page logic (no Gradio) --------------------------------------------------------------------


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


def attention_shape(model: Captioner) -> tuple[int, int]:
    """(layers, heads) of the decoder's attention maps: (1, 1) for the LSTM."""
    decoder = model.config.decoder
    return (decoder.num_layers, decoder.num_heads) if decoder.type == "transformer" else (1, 1)


def attention_choices(model: Captioner) -> tuple[list[str], list[str]]:
    """Dropdown choices: layers "1".."L" (default the last) and heads "mean", "1".."H"."""
    layers, heads = attention_shape(model)
    return [str(i + 1) for i in range(layers)], [MEAN, *(str(i + 1) for i in range(heads))]


def parse_layer_head(caption: Caption, layer: str | int | None, head: str | int | None) -> tuple[int, int | None]:
    """Dropdown values -> (layer index, head index or None for the mean), clamped to the caption's
    maps, so a choice left over from another model never indexes out of range."""
    num_layers, num_heads = caption.attn.shape[1:3]
    try:
        layer_index = min(max(int(layer) - 1, 0), num_layers - 1)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        layer_index = num_layers - 1
    try:
        head_index: int | None = int(head) - 1  # type: ignore[arg-type]
    except (TypeError, ValueError):
        head_index = None
    if head_index is not None and not 0 <= head_index < num_heads:
        head_index = None
    return layer_index, head_index


@dataclass(frozen=True)
class Request:
    """A checked /caption request: values the page's own controls could have sent."""

    model_name: str
    beam_size: int
    max_length: int
    layer: str | None
    head: str


def whole_number(value: Any, what: str, low: int, high: int) -> int:
    """`value` as an int in [low, high]; sliders send floats, so 3.0 is 3, but 2.5, NaN, True
    and "3" are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{what} must be a whole number from {low} to {high}, got {value!r}")
    if not (math.isfinite(value) and value == int(value) and low <= value <= high):
        raise RequestError(f"{what} must be a whole number from {low} to {high}, got {value!r}")
    return int(value)


def menu_value(value: Any) -> str | None:
    """A dropdown value as the menu's string ("2" for 2), None for no choice."""
    if value is None or value == "":
        return None
    return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else repr(value)


def check_request(
    models: dict[str, Captioner], model_name: Any, beam_size: Any, max_length: Any, layer: Any, head: Any
) -> Request:
    """Check every value of a /caption request against what the page offers, or raise
    `RequestError` naming the value. No model name picks the first model; no layer or head the
    defaults (the last layer, the mean of heads)."""
    if model_name in (None, ""):
        model_name = next(iter(models))
    if not isinstance(model_name, str) or model_name not in models:
        raise RequestError(f"unknown model {str(model_name)[:80]!r}: choose one of the menu's models")
    model = models[model_name]
    beam = whole_number(beam_size, "beam width", 1, MAX_BEAM)
    length = whole_number(max_length, "maximum length", 1, MAX_LENGTH)
    layers, heads = attention_choices(model)
    layer, head = menu_value(layer), menu_value(head) or MEAN
    if layer is not None and layer not in layers:
        raise RequestError(f"decoder layer must be one of {', '.join(layers)} for this model, got {layer[:20]!r}")
    if head not in heads:
        raise RequestError(f"attention head must be one of {', '.join(heads)} for this model, got {head[:20]!r}")
    return Request(model_name, beam, length, layer, head)


def conversion_notes(path: str | Path) -> list[str]:
    """What `load_image` did to this file to make it 8-bit upright RGB, in words. Reads only the
    header, through the loader's own format-restricted opener; never raises (the loader reports
    unreadable files)."""
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


def refusal(message: str) -> PageOutput:
    return PageOutput("", "", [], None, f"**Could not caption this file.** {message}")


def caption_page(
    model: Captioner,
    model_name: str,
    upload: str | Path | None,
    beam_size: int,
    max_length: int,
    layer: str | int | None = None,
    head: str | int | None = MEAN,
    figure_dir: Path | None = None,
    max_pixels: int = MAX_PIXELS,
) -> PageOutput:
    """Caption an uploaded file and draw its heatmaps (and its figure into `figure_dir`, if given).
    A file the loader refuses gives its one-line reason in the note, named by the file's own name
    rather than the server's temporary path."""
    if upload is None or str(upload) == "":
        return PageOutput("", "", [], None, "Upload an image or pick an example first.")
    path = Path(upload)
    started = time.perf_counter()
    try:
        image = load_image(path, max_pixels)
    except ImageLoadError as e:
        return refusal(str(e).replace(str(path), path.name))
    # Transformers keep their self-attention from this same pass, for the head view.
    self_attention = model.decoder.has_self_attention
    caption = model.caption(image, beam_size=int(beam_size), max_length=int(max_length), self_attention=self_attention)
    shown = image.copy()
    shown.thumbnail((DISPLAY_SIDE, DISPLAY_SIDE))
    notes = conversion_notes(path)
    if not caption.finished:
        notes.append(f"The caption reached the maximum length ({int(max_length)} words) before the model ended it.")
    result = Result(caption, shown, model_name, int(beam_size), time.perf_counter() - started, notes)
    return render_page(result, layer, head, figure_dir)


def render_page(result: Result, layer: str | int | None, head: str | int | None, figure_dir: Path | None = None) -> PageOutput:
    """Overlays (and the figure, when `figure_dir` is given) for one layer/head choice of an
    already captioned image."""
    caption = result.caption
    layer_index, head_index = parse_layer_head(caption, layer, head)
    gallery = [(picture, word) for word, picture in word_overlays(result.image, caption, layer_index, head_index)]
    maps = maps_label(caption, layer_index, head_index)
    score_line = (
        f"score {caption.score:.3f} · log-probability {caption.logprob:.2f} · "
        f"{len(caption.words)} words · beam {result.beam_size} · {result.model_name}"
        f"{' · ' + maps if maps else ''} · captioned in {result.seconds:.2f} s"
    )
    note = " ".join(result.notes)
    if not caption.words:
        note = (note + " The model ended the caption at once: there is no word to show.").strip()
    figure = write_figure(result, layer, head, figure_dir) if figure_dir is not None else None
    return PageOutput(caption.text, score_line, gallery, figure, note, result)


def maps_label(caption: Caption, layer: int, head: int | None) -> str:
    """'layer 2, head 1' for a multi-layer or multi-head decoder; '' when there is one map a word."""
    if caption.attn.shape[1] == 1 and caption.attn.shape[2] == 1:
        return ""
    return f"layer {layer + 1}, " + ("mean of heads" if head is None else f"head {head + 1}")


def write_figure(result: Result, layer: str | int | None, head: str | int | None, figure_dir: Path) -> Path:
    """The downloadable figure: the image, then each word over its map (the CLI's --heatmaps
    figure). About a second for twenty words, so the page draws it after showing the caption."""
    prune(figure_dir)
    caption = result.caption
    layer_index, head_index = parse_layer_head(caption, layer, head)
    maps = maps_label(caption, layer_index, head_index)
    title = f"{caption.text}  (score {caption.score:.2f}{', ' + maps if maps else ''})"
    path = figure_dir / f"attention_{uuid.uuid4().hex[:12]}.png"
    with _FIGURE_LOCK:
        return save_attention_figure(path, result.image, caption, layer=layer_index, head=head_index, title=title)


def prune(folder: Path, max_age_s: float = 600.0) -> None:
    """Delete old pictures: Gradio has copied each into its own cache by the time it is served."""
    if not folder.is_dir():
        return
    now = time.time()
    for old in [*folder.glob("attention_*.png"), *folder.glob("overlay_*.jpg")]:
        try:
            if now - old.stat().st_mtime > max_age_s:
                old.unlink()
        except OSError:
            pass  # another request removed it first


def inside_views(result: Result, layer: str | int | None, head: str | int | None, word: str | None) -> tuple:
    """The transformer views of a captioned image: the self-attention head view of the chosen
    layer (the chosen head, or every head and their mean), and the chosen word's cross-attention
    as a layers x heads grid of maps. -> (head view, head grid) PIL images, None for the LSTM."""
    from captioner.viz.figures import head_grid_figure, head_view_figure

    caption = result.caption
    if caption.self_attn is None or not caption.words:
        return None, None
    layer_index, head_index = parse_layer_head(caption, layer, head)
    position = word_position(caption, word)
    with _FIGURE_LOCK:
        view = figure_image(head_view_figure(caption, [layer_index], None if head_index is None else [head_index]))
        grid = figure_image(head_grid_figure(result.image, caption, [position]))
    return view, grid


def word_position(caption: Caption, word: str | None) -> int:
    """A word menu value "3: circle" -> 2; anything else -> the first word."""
    try:
        position = int(str(word).split(":", 1)[0]) - 1
    except ValueError:
        return 0
    return position if 0 <= position < len(caption.words) else 0


def word_choices(caption: Caption) -> list[str]:
    return [f"{i + 1}: {w}" for i, w in enumerate(caption.words)]


def figure_image(fig: Any) -> Image.Image:
    """A matplotlib figure as a PIL image (closed after)."""
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    plt.close(fig)
    buffer.seek(0)
    return Image.open(buffer).convert("RGB")


def model_card(path: str, model: Captioner, payload: dict[str, Any]) -> str:
    """One Markdown line: what a served model was trained on and how it scored on validation,
    from the checkpoint's config, vocabulary and train state."""
    config = config_from_dict(payload["config"], source=path) if payload else None
    state = payload.get("train_state") or {}
    history = state.get("history") or []
    best_epoch, best_step = state.get("best_epoch"), state.get("best_step")
    row = next((r for r in history if r.get("epoch") == best_epoch and best_step in (None, r.get("step"))), history[-1] if history else None)
    metric = config.train.val_metric if config else "?"
    if row:
        scores = ", ".join(f"{k[4:]} {float(v):.3f}" for k, v in row.items() if k.startswith("val_"))
        where = f"epoch {row['epoch']}" + (f", step {row['step']}" if "epochs_done" in row else "")  # mid-epoch (train.val_every_steps)
        val = f"validation at {where} of {state.get('epoch', '?')} (best {metric}): {scores}"
    else:
        val = "no validation scores in the checkpoint"
    dataset = config.data.dataset if config else "an unknown dataset"
    return (
        f"**{model_label(path, model)}**: trained on **{dataset}** ({model.image_size} px images), "
        f"vocabulary {len(model.vocab)} words; {val}."
    )


def model_cards(models: dict[str, Captioner]) -> str:
    """What every served model was trained on, so a caption is read in its light (the shapes
    model describes coloured shapes, whatever the photograph)."""
    from captioner.models.checkpoint import read_checkpoint

    lines = []
    for path, model in models.items():
        try:
            payload = read_checkpoint(path)
        except CaptionerError:
            payload = {}
        lines.append("- " + model_card(path, model, payload))
    return "**Models served**\n\n" + "\n".join(lines)


# --- models, examples and the "no arguments" default -------------------------------------------


def load_models(checkpoints: list[Path], device: str = "cpu") -> dict[str, Captioner]:
    """Checkpoint path -> model; a bad checkpoint stops the start with its one-line error."""
    if not checkpoints:
        raise CaptionerError("demo: no checkpoint to serve")
    return {str(path): load_captioner(path, device) for path in dict.fromkeys(checkpoints)}


def model_label(path: str, model: Captioner) -> str:
    """What the model menu shows: 'run/best.pt (lstm over small_cnn)'."""
    name = Path(path)
    return f"{name.parent.name}/{name.name} ({model.config.decoder.type} over {model.config.encoder.name})"


def default_checkpoint(config_path: Path = DEFAULT_CONFIG) -> Path:
    """The quickstart's model: its best.pt if trained, else train it now (progress in the log)."""
    if not config_path.is_file():
        raise CaptionerError(f"{config_path}: not found; run the demo from the project folder or give a CHECKPOINT")
    config = load_config(config_path)
    best = Path(config.train.out_dir) / "best.pt"
    if best.is_file():
        return best
    from captioner.training.fit import fit

    log.info("no trained model at %s: training %s first (the quickstart's model; minutes on a CPU)", best, config_path)
    return fit(config)


def dataset_examples(config: Config, count: int = 4) -> list[Path]:
    """The first test images of the dataset a model was trained on, where they are on this machine."""
    data = config.data
    if data.dataset == "shapes" and not (Path(data.root) / "captions_test.json").is_file():
        return []  # never generate a dataset just for examples
    try:
        records = load_split(data, "test", check_images=False)
    except CaptionerError:
        return []
    return [r.path for r in records if r.path.is_file()][:count]


# --- the page ----------------------------------------------------------------------------------


class UploadImage(gr.Image):
    """An image input that hands the uploaded file to the captioner untouched.

    gr.Image would decode and convert the file itself, so a non-image would fail inside Gradio
    with no useful message, and a 16-bit or CMYK file would be converted twice; here our own
    loader validates and converts every file, exactly as for the CLI.
    """

    is_template = True  # drawn by the frontend's Image component

    def preprocess(self, payload: Any) -> str | None:
        if payload is None:
            return None
        if getattr(payload, "path", None):
            return str(payload.path)
        return super().preprocess(payload)  # a base64 data URL: let Gradio write it to a file


class Callbacks:
    """What the page's events run: the loaded models, and Gradio values in and out."""

    def __init__(self, models: dict[str, Captioner], max_pixels: int = MAX_PIXELS) -> None:
        self.models = models
        self.max_pixels = max_pixels
        self.out_dir = Path(tempfile.mkdtemp(prefix="captioner-demo-"))
        self._running = 0  # callbacks in flight on the server's worker threads
        self._idle = threading.Condition()

    def tracked(self, callback: Callable[..., Any]) -> Callable[..., Any]:
        """`callback`, counted while it runs, so that `close` can wait for it: a worker thread
        still inside torch when the interpreter exits aborts the process (exit status 134)."""

        @functools.wraps(callback)  # Gradio reads the signature for the API
        def run(*args: Any) -> Any:
            with self._idle:
                self._running += 1
            try:
                return callback(*args)
            finally:
                with self._idle:
                    self._running -= 1
                    self._idle.notify_all()

        return run

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no callback runs; False if one still does after `timeout` seconds."""
        with self._idle:
            return self._idle.wait_for(lambda: self._running == 0, timeout)

    def model(self, name: str) -> tuple[str, Captioner]:
        name = name if name in self.models else next(iter(self.models))
        return name, self.models[name]

    def caption(self, image: str | None, model_name: str, beam_size: float, max_length: float, layer: str, head: str) -> tuple:
        """The /caption endpoint. Every request value is checked here, whatever the page's
        controls allow, before any decoding: a refused request is answered at once."""
        try:
            if image is not None and not isinstance(image, (str, Path)):
                raise RequestError(f"the image must be an uploaded file, got a {type(image).__name__}")
            request = check_request(self.models, model_name, beam_size, max_length, layer, head)
            model = self.models[request.model_name]
            label = model_label(request.model_name, model)
            page = caption_page(
                model, label, image, request.beam_size, request.max_length, request.layer, request.head, None, self.max_pixels
            )
        except RequestError as e:
            page = PageOutput("", "", [], None, f"**Request refused.** {e}")
        except Exception:  # a bug: the log gets the traceback, the page a sentence
            log.exception("captioning failed")
            page = PageOutput("", "", [], None, "**Something went wrong on the server** (the error is in its log).")
        return self.outputs(page)

    def redraw(self, result: Result | None, layer: str, head: str) -> tuple:
        if result is None:  # nothing captioned yet
            return tuple(gr.skip() for _ in range(5))
        return self.outputs(render_page(result, layer, head))

    def figure(self, result: Result | None, layer: str, head: str) -> str | None:
        """The second step of a caption or redraw: the figure for the download button."""
        if result is None:
            return None
        try:
            return str(write_figure(result, layer, head, self.out_dir))
        except Exception:  # the caption is on the page already; a figure is not worth an error
            log.exception("drawing the figure failed")
            return None

    def inside(self, result: Result | None, layer: str, head: str, word: str | None) -> tuple:
        """The transformer views (head view, per-head maps, the word menu) of the kept caption."""
        if result is None or result.caption.self_attn is None:
            hidden = gr.update(visible=False)
            return hidden, hidden, hidden
        try:
            view, grid = inside_views(result, layer, head, word)
        except Exception:  # the caption is on the page already
            log.exception("drawing the transformer views failed")
            return gr.skip(), gr.skip(), gr.skip()
        choices = word_choices(result.caption)
        value = choices[word_position(result.caption, word)] if choices else None
        return (
            gr.update(value=view, visible=True),
            gr.update(value=grid, visible=True),
            gr.update(choices=choices, value=value, visible=True),
        )

    def choose_model(self, model_name: str) -> tuple[gr.Dropdown, gr.Dropdown]:
        """Layer and head menus for this model's decoder."""
        layer, head = menus(self.model(model_name)[1])
        return gr.Dropdown(**layer), gr.Dropdown(**head)

    def outputs(self, page: PageOutput) -> tuple:
        """Page values in the order of the page's outputs (the figure is a step of its own)."""
        return page.text, page.score_line, self.files(page.gallery), page.note, page.result

    def files(self, gallery: list[tuple[Image.Image, str]]) -> list[tuple[str, str]]:
        """Overlays as JPEG files of unique names. Gradio would write PIL images in place to paths
        named by their content, so when two requests get the same overlay, one could download it
        while the other rewrites it; it copies files into its cache atomically."""
        prune(self.out_dir)
        paths = [self.out_dir / f"overlay_{uuid.uuid4().hex[:12]}.jpg" for _ in gallery]
        for path, (picture, _) in zip(paths, gallery):
            picture.save(path, quality=90)
        return [(str(path), word) for path, (_, word) in zip(paths, gallery)]


def build_demo(
    checkpoints: list[Path],
    examples: list[Path] | None = None,
    concurrency: int = 1,
    queue_size: int = QUEUE_SIZE,
    max_pixels: int = MAX_PIXELS,
    device: str = "cpu",
) -> gr.Blocks:
    """The page, with a queue: `concurrency` captions run at once (1 gives each every core), up
    to `queue_size` wait, the rest are told the queue is full. `examples` None: the first test
    images of the first model's dataset, where they are on this machine."""
    callbacks = Callbacks(load_models(checkpoints, device), max_pixels)
    first_name, first = callbacks.model("")
    examples = dataset_examples(checkpoint_config(first_name)) if examples is None else examples
    with gr.Blocks(title="captioner: attention heatmaps", analytics_enabled=False, delete_cache=(600, 3600)) as demo:
        gr.Markdown(
            "## Image captioning with spatial attention\n"
            "Upload an image or pick an example, then **Caption**. Each word comes with the map of "
            "where the model looked while writing it."
        )
        with gr.Row():
            with gr.Column(scale=1):
                image = UploadImage(label="Image", type="filepath", sources=["upload", "clipboard"], height=320, elem_id="image")
                choices = [(model_label(name, model), name) for name, model in callbacks.models.items()]
                model_name = gr.Dropdown(choices, value=first_name, label="Model", elem_id="model")
                decode = first.decode_config
                with gr.Row():
                    beam = gr.Slider(1, MAX_BEAM, value=min(decode.beam_size, MAX_BEAM), step=1, label="Beam width", elem_id="beam")
                    length = gr.Slider(
                        1, MAX_LENGTH, value=min(decode.max_length, MAX_LENGTH), step=1, label="Maximum length", elem_id="max_length"
                    )
                with gr.Row():
                    layer_menu, head_menu = menus(first)
                    layer = gr.Dropdown(label="Decoder layer", elem_id="layer", **layer_menu)
                    head = gr.Dropdown(label="Attention head", elem_id="head", **head_menu)
                run = gr.Button("Caption", variant="primary", elem_id="run")
                if examples:
                    gr.Examples([[str(p)] for p in examples], inputs=[image], label="Examples")
            with gr.Column(scale=2):
                text = gr.Textbox(label="Caption", interactive=False, elem_id="caption")
                score = gr.Markdown(label="Score", elem_id="score")
                note = gr.Markdown(label="Note", elem_id="note")
                gallery = gr.Gallery(label="Attention per word", columns=4, height="auto", elem_id="heatmaps")
                download = gr.DownloadButton("Download the figure", interactive=False, elem_id="download")
                # Transformers only: shown once a caption has self-attention weights.
                head_view = gr.Image(label="Self-attention head view (each word to the earlier words it attends to; "
                                     "layer and head from the menus)", type="pil", visible=False, elem_id="head_view")
                grid_word = gr.Dropdown(label="Word for the per-head maps", choices=[], visible=False, elem_id="grid_word")
                head_grid = gr.Image(label="Cross-attention per layer and head", type="pil", visible=False, elem_id="head_grid")
        gr.Markdown(model_cards(callbacks.models), elem_id="model_card")
        result = gr.State(None)

        # Each event: disable the download at once, show the caption and heatmaps, draw the figure
        # (about a second more), enable the download. The API: /caption, then /figure in its session.
        shown = [text, score, gallery, note, result]
        cpu = {"concurrency_id": "cpu"}  # captions and figures share the queue's workers
        private = {"api_visibility": "private"}

        def then_figure(event: Any, **api: Any) -> None:
            drawn = event.then(callbacks.tracked(callbacks.figure), [result, layer, head], [download], **cpu, **api)
            drawn.then(enable_download, [download], [download], queue=False, **private)

        captioned = run.click(disable_download, None, [download], queue=False, **private).then(
            callbacks.tracked(callbacks.caption), [image, model_name, beam, length, layer, head], shown, api_name="caption", **cpu
        )
        then_figure(captioned, api_name="figure")
        inside_in, inside_out = [result, layer, head, grid_word], [head_view, head_grid, grid_word]
        captioned.then(callbacks.tracked(callbacks.inside), inside_in, inside_out, **cpu, **private)
        for menu in (layer, head):  # a new layer/head redraws the kept caption; no decoding again
            cleared = menu.input(disable_download, None, [download], queue=False, **private)
            redrawn = cleared.then(callbacks.tracked(callbacks.redraw), [result, layer, head], shown, **cpu, **private)
            then_figure(redrawn, **private)
            redrawn.then(callbacks.tracked(callbacks.inside), inside_in, inside_out, **cpu, **private)
        grid_word.input(callbacks.tracked(callbacks.inside), inside_in, inside_out, **cpu, **private)
        model_name.change(callbacks.choose_model, [model_name], [layer, head], queue=False, **private)
    _CALLBACKS[demo] = callbacks
    return demo.queue(default_concurrency_limit=concurrency, max_size=queue_size)


_CALLBACKS: weakref.WeakKeyDictionary[gr.Blocks, Callbacks] = weakref.WeakKeyDictionary()


def close(demo: gr.Blocks, timeout: float = 120.0) -> None:
    """Stop the server, then wait for the captions and figures it was still computing: the
    server's worker threads are daemons, and one left inside torch when the interpreter exits
    aborts it ("terminate called without an active exception")."""
    demo.close()
    callbacks = _CALLBACKS.get(demo)
    if callbacks is not None and not callbacks.wait_idle(timeout):
        log.warning("the demo closed with a caption still running after %.0f s", timeout)


def disable_download() -> gr.DownloadButton:
    return gr.DownloadButton(value=None, interactive=False)


def enable_download(figure: str | None) -> gr.DownloadButton:
    return gr.DownloadButton(interactive=bool(figure))


def menus(model: Captioner) -> tuple[dict[str, Any], dict[str, Any]]:
    """Layer and head menu settings (last layer, mean of heads); hidden for one map per word."""
    layers, heads = attention_choices(model)
    visible = len(layers) > 1 or len(heads) > 2
    return {"choices": layers, "value": layers[-1], "visible": visible}, {"choices": heads, "value": MEAN, "visible": visible}


def launch(
    demo: gr.Blocks,
    host: str = "127.0.0.1",
    port: int = 7860,
    block: bool = True,
    max_file_size: str | int = MAX_FILE_SIZE,
) -> str:
    """Serve the page; returns its URL (at once when not `block`, e.g. in tests). Nothing here
    reaches the internet: no share link, no server-side rendering, analytics off."""
    _, url, _ = demo.launch(
        server_name=host,
        server_port=port,
        share=False,
        prevent_thread_lock=not block,
        max_file_size=max_file_size,
        ssr_mode=False,
        pwa=False,
        mcp_server=False,
        enable_monitoring=False,
        show_error=False,  # no exception text in the page; the callbacks put messages there themselves
        quiet=not block,
    )
    return url


def serve(
    checkpoints: list[Path] | None = None,
    examples: list[Path] | None = None,
    host: str = "127.0.0.1",
    port: int = 7860,
) -> None:
    """`captioner demo`: the given checkpoints, by default the quickstart's model (trained first
    when missing), until interrupted."""
    demo = build_demo(checkpoints or [default_checkpoint()], examples)
    log.info("serving the demo on http://%s:%d", host, port)
    try:
        launch(demo, host, port, block=True)
    finally:  # interrupted: let the captions in flight finish before the interpreter exits
        close(demo)
