"""The Gradio page: its components, the callbacks its events run, the request queue, and its cache.
The callbacks translate between Gradio values and `captioner.apps.demo.page`; the API: /caption, then /figure."""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr
from PIL import Image

from captioner.apps.demo.batcher import MAX_BATCH, CaptionBatcher
from captioner.apps.demo.decoding import DecodeProcess, Decoder, LocalDecoder
from captioner.apps.demo.cards import load_models, model_cards, model_examples, model_label, recorded, serving_line
from captioner.apps.demo.inputs import DemoBlocks, Menu, RequestSlider, UploadImage
from captioner.apps.demo.page import (MAX_BEAM, MAX_LENGTH, PageOutput, Result, caption_page, check_request,
                                     inside_views, menus, message, prune, prune_folders, render_page, word_choices,
                                     word_position, write_figure)
from captioner.core.errors import CaptionerError, RequestError
from captioner.data.image_files import MAX_PIXELS
from captioner.models.captioner import Captioner

log = logging.getLogger(__name__)

QUEUE_SIZE = 32  # waiting events beyond this are told the app is busy: at most a few seconds' work
JPEG_QUALITY = 85  # the overlays the gallery shows: a tenth of a PNG's bytes, no visible loss at this size
VIEW_QUALITY = 95  # the head view and per-head maps: their thin lines and small words ring at 85
OWNER = "CAPTIONER_DEMO_CACHE_OWNER"  # "<process id> <folder>": the process whose private cache that is


def private_cache() -> Path | None:
    """A Gradio cache of this process's own, removed at exit, unless GRADIO_TEMP_DIR names the user's or ours; the
    new folder, or None. A closing server deletes its files: in a shared cache, another's uploads."""
    chosen = os.environ.get("GRADIO_TEMP_DIR")
    owner, _, folder = os.environ.get(OWNER, "").partition(" ")
    if chosen and (folder != chosen or owner == str(os.getpid())):
        return None
    cache = Path(tempfile.mkdtemp(prefix="captioner-demo-cache-"))
    os.environ["GRADIO_TEMP_DIR"], os.environ[OWNER] = str(cache), f"{os.getpid()} {cache}"
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    return cache


@dataclass(frozen=True)
class Cleanup:
    """Every `every_s` seconds, files older than `max_age_s` go (with `empty_folders`, a private cache's folders)."""

    every_s: float = 600.0
    max_age_s: float = 3600.0
    empty_folders: bool = False


class Callbacks:
    """What the page's events run: the loaded models, and Gradio values in and out."""

    def __init__(self, models: dict[str, Captioner], max_pixels: int = MAX_PIXELS, max_batch: int = MAX_BATCH,
                 cleanup: Cleanup = Cleanup(), decoder: Decoder | None = None) -> None:
        from gradio.utils import get_upload_folder

        self.models = models
        self.decoder = decoder or LocalDecoder(list(models.values()))
        self.serving: dict[str, str] = {}  # model name -> its "Serving: ..." line (set by build_demo)
        self.payloads: dict[str, dict[str, Any]] = {}  # model name -> what its checkpoint records, for the cards
        self.max_pixels = max_pixels
        self.batcher = CaptionBatcher(max_batch, self.decoder)
        self.cleanup = cleanup
        # Inside Gradio's cache, which then serves the pictures where they are instead of copying each.
        self.cache = Path(get_upload_folder())
        self.out_dir = self.cache / f"captioner-demo-{uuid.uuid4().hex[:12]}"
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # GRADIO_TEMP_DIR naming a file or a folder this process may not write
            raise CaptionerError(f"demo: GRADIO_TEMP_DIR {self.cache}: cannot hold the page's pictures "
                                 f"({e.strerror or e}); name a folder this user may write") from None
        self._pruned = time.monotonic()
        self._empty_folders: set[Path] = set()  # the cache's folders found empty at the last prune
        self._running = 0  # callbacks in flight on the server's worker threads
        self._idle = threading.Condition()

    def tracked(self, callback: Callable[..., Any]) -> Callable[..., Any]:
        """`callback`, counted while it runs so `close` can wait: a worker in torch at exit aborts the process."""

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

    def caption(self, image: str | None, model_name: str, beam_size: float, max_length: float, layer: str,
                head: str) -> tuple:
        """The /caption endpoint: every value is checked before any decoding, whatever the controls allow."""
        try:
            if image is not None and not isinstance(image, (str, Path)):
                raise RequestError(f"the image must be an uploaded file, got a {type(image).__name__}")
            request = check_request(self.models, model_name, beam_size, max_length, layer, head)
            model = self.models[request.model_name]
            page = caption_page(model, model_label(request.model_name, model), image, request.beam_size,
                                request.max_length, request.layer, request.head, None, self.max_pixels, self.batcher)
        except RequestError as e:
            page = message(f"**Request refused.** {e}")
        except Exception:  # a bug: the log gets the traceback, the page a sentence
            log.exception("captioning failed")
            page = message("**Something went wrong on the server** (the error is in its log).")
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
            self.prune()
            return str(write_figure(result.image, result.caption, layer, head, self.out_dir))
        except Exception:  # the caption is on the page already; a figure is not worth an error
            log.exception("drawing the figure failed")
            return None

    def inside(self, result: Result | None, layer: str, head: str, word: str | None) -> tuple:
        """The transformer views (head view, per-head maps, the word menu) of the kept caption."""
        if result is None or result.caption.self_attn is None:
            hidden = gr.update(visible=False)
            return hidden, hidden, hidden
        try:
            view, grid = self.jpegs("view", list(inside_views(result.image, result.caption, layer, head, word)),
                                    VIEW_QUALITY)
        except Exception:  # the caption is on the page already
            log.exception("drawing the transformer views failed")
            return gr.skip(), gr.skip(), gr.skip()
        choices = word_choices(result.caption)
        value = choices[word_position(result.caption, word)] if choices else None
        return (gr.update(value=view, visible=True), gr.update(value=grid, visible=True),
                gr.update(choices=choices, value=value, visible=True))

    def choose_model(self, model_name: str) -> tuple[gr.Dropdown, gr.Dropdown, str]:
        """Layer and head menus for this model's decoder, and the line saying it serves."""
        name, model = self.model(model_name)
        layer, head = menus(model)
        return gr.Dropdown(**layer), gr.Dropdown(**head), self.serving.get(name, "")

    def outputs(self, page: PageOutput) -> tuple:
        """Page values in the order of the page's outputs (the figure is a step of its own)."""
        return page.text, page.score_line, self.files(page.gallery), page.note, page.result

    def files(self, gallery: list[tuple[Image.Image, str]]) -> list[tuple[str, str]]:
        """The gallery's overlays as files, each with its word."""
        paths = self.jpegs("overlay", [picture for picture, _ in gallery], JPEG_QUALITY)
        return [(path, word) for path, (_, word) in zip(paths, gallery)]

    def jpegs(self, kind: str, pictures: list[Image.Image], quality: int) -> list[str]:
        """Pictures as JPEG files named kind_<unique>.jpg: Gradio's names by content let a request rewrite another's,
        and its own WebP costs 20 ms of CPU a view (bench_demo_load)."""
        self.prune()
        paths = [self.out_dir / f"{kind}_{uuid.uuid4().hex[:12]}.jpg" for _ in pictures]
        for path, picture in zip(paths, pictures):
            picture.save(path, quality=quality)
        return [str(path) for path in paths]

    def prune(self) -> None:
        """At most every `cleanup.every_s` seconds: delete old pictures (and in a private cache, empty folders)."""
        now = time.monotonic()
        if now - self._pruned < self.cleanup.every_s:
            return
        self._pruned = now
        self.out_dir.mkdir(parents=True, exist_ok=True)  # a cache cleared under us
        prune(self.out_dir, self.cleanup.max_age_s)
        if self.cleanup.empty_folders:
            self._empty_folders = prune_folders(self.cache, self.out_dir, self._empty_folders)


def disable_download() -> gr.DownloadButton:
    return gr.DownloadButton(value=None, interactive=False)


def enable_download(figure: str | None) -> gr.DownloadButton:
    return gr.DownloadButton(interactive=bool(figure))


def build_demo(checkpoints: list[Path], examples: list[Path] | None = None, max_batch: int = MAX_BATCH,
               queue_size: int = QUEUE_SIZE, max_pixels: int = MAX_PIXELS, device: str = "cpu",
               cleanup: Cleanup = Cleanup(), decode_process: bool = True) -> gr.Blocks:
    """The page, with a bounded queue: `max_batch` events at once, `queue_size` more wait, the rest told it is busy.
    Captions decode in a process of their own (`decoding.DecodeProcess`, started with the first), or with
    `decode_process=False` in the server's threads; `close` ends the process."""
    private_cache()  # before anything is cached: closing this process deletes no other's files
    keep_cache_cleanup_alive()  # before the page schedules Gradio's cache sweep
    models = load_models(checkpoints, device)
    decoder = DecodeProcess(list(models.values())) if decode_process else None  # None: Callbacks' LocalDecoder
    callbacks = Callbacks(models, max_pixels, max_batch, cleanup, decoder)
    callbacks.payloads = {name: recorded(name) for name in callbacks.models}  # each checkpoint read once more
    callbacks.serving = {name: serving_line(name, model, callbacks.payloads[name])
                         for name, model in callbacks.models.items()}
    first_name, _ = callbacks.model("")
    examples = model_examples(first_name) if examples is None else examples
    with DemoBlocks(title="captioner: attention heatmaps", analytics_enabled=False,
                    delete_cache=cache_lifetimes(cleanup)) as demo:
        lay_out_page(callbacks, examples, cleanup)
    _CALLBACKS[demo] = callbacks
    demo.queue(default_concurrency_limit=max_batch, max_size=queue_size)
    skip_event_analytics(demo)
    return demo


def skip_event_analytics(demo: gr.Blocks) -> None:
    """After every event Gradio's queue sums up the events it keeps (up to 10,000, in a pandas DataFrame) for a
    monitoring dashboard this page never turns on (`launch`: enable_monitoring=False): 2.7 ms of CPU an event, 10 ms
    once 10,000 are kept. This page's queue keeps one and never sums; a Gradio without these settings is left as it
    is."""
    queue = getattr(demo, "_queue", None)
    if queue is not None and hasattr(queue, "ANAYLTICS_CACHE_FREQUENCY") and hasattr(queue, "ANALYTICS_MAX_EVENTS"):
        queue.ANAYLTICS_CACHE_FREQUENCY = sys.maxsize  # Gradio's spelling: events between two summaries
        queue.ANALYTICS_MAX_EVENTS = 1


def cache_lifetimes(cleanup: Cleanup) -> tuple[int, int]:
    """Gradio's `delete_cache`: how often to look, and how old a file may be, in whole seconds (at least 1)."""
    return max(1, round(cleanup.every_s)), max(1, round(cleanup.max_age_s))


def keep_cache_cleanup_alive() -> None:
    """Gradio's `delete_cache` sweep iterates sets that requests add to from other threads: a "Set changed
    size during iteration" ends its schedule for the server's life, and uploads pile up. Wrapped: the sweep
    is tried again, and a round that still races is skipped (the next round sweeps it)."""
    from gradio import route_utils

    sweep = getattr(route_utils, "delete_files_created_by_app", None)  # a Gradio without it: nothing to wrap
    if sweep is None or getattr(sweep, "captioner_tolerant", False):
        return

    @functools.wraps(sweep)
    def tolerant(blocks: gr.Blocks, age: int | None) -> None:
        for _ in range(3):
            try:
                return sweep(blocks, age)
            except RuntimeError:  # a request added a file meanwhile
                continue
        log.debug("demo: Gradio's cache sweep raced with requests three times; the next round sweeps")

    tolerant.captioner_tolerant = True  # type: ignore[attr-defined]
    route_utils.delete_files_created_by_app = tolerant


def slider_starts(model: Captioner) -> tuple[int, int]:
    """Where the beam and length sliders start: the model's own decoding defaults, within the page's limits."""
    decode = model.decode_config
    return min(decode.beam_size, MAX_BEAM), min(decode.max_length, MAX_LENGTH)


def lay_out_page(callbacks: Callbacks, examples: list[Path], cleanup: Cleanup) -> None:
    """The components, inside the open `gr.Blocks` (request left, answer right, cards below), and their events."""
    first_name, first = callbacks.model("")
    gr.Markdown("## Image captioning with spatial attention\nUpload an image or pick an example, then **Caption**. "
                "Each word comes with the map of where the model looked while writing it.")
    serving = gr.Markdown(callbacks.serving[first_name], elem_id="serving")  # which model answers, and how it scored
    with gr.Row():
        with gr.Column(scale=1):
            image = UploadImage(label="Image", type="filepath", sources=["upload", "clipboard"], height=320,
                                elem_id="image")
            choices = [(model_label(name, model), name) for name, model in callbacks.models.items()]
            model_name = Menu(choices, value=first_name, label="Model", elem_id="model")
            beam_start, length_start = slider_starts(first)
            with gr.Row():
                beam = RequestSlider(1, MAX_BEAM, value=beam_start, step=1, label="Beam width", elem_id="beam")
                length = RequestSlider(1, MAX_LENGTH, value=length_start, step=1, label="Maximum length",
                                       elem_id="max_length")
            with gr.Row():
                layer_menu, head_menu = menus(first)
                layer = Menu(label="Decoder layer", elem_id="layer", **layer_menu)
                head = Menu(label="Attention head", elem_id="head", **head_menu)
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
                                 "layer and head from the menus)", type="filepath", visible=False, elem_id="head_view")
            grid_word = gr.Dropdown(label="Word for the per-head maps", choices=[], visible=False, elem_id="grid_word")
            head_grid = gr.Image(label="Cross-attention per layer and head", type="filepath", visible=False,
                                 elem_id="head_grid")
    gr.Markdown(model_cards(callbacks.models, callbacks.payloads), elem_id="model_card")
    result = gr.State(None, time_to_live=cleanup.max_age_s)  # a redraw needs it only as long as its pictures live

    shown = [text, score, gallery, note, result]
    # Gradio skips a step ("once") whose previous run is pending, so a caption arriving meanwhile would
    # never get its views: each step runs again, on the newest values, when the pending one ends.
    latest = {"trigger_mode": "always_last"}
    cpu = {"concurrency_id": "cpu", **latest}  # captions and figures share the queue's max_batch workers
    private = {"api_visibility": "private"}

    def then_figure(event: Any, **api: Any) -> None:
        drawn = event.then(callbacks.tracked(callbacks.figure), [result, layer, head], [download], **cpu, **api)
        drawn.then(enable_download, [download], [download], queue=False, **latest, **private)

    captioned = run.click(disable_download, None, [download], queue=False, **private).then(
        callbacks.tracked(callbacks.caption), [image, model_name, beam, length, layer, head], shown,
        api_name="caption", **cpu)
    then_figure(captioned, api_name="figure")
    inside_in, inside_out = [result, layer, head, grid_word], [head_view, head_grid, grid_word]
    captioned.then(callbacks.tracked(callbacks.inside), inside_in, inside_out, **cpu, **private)
    for menu in (layer, head):  # a new layer/head redraws the kept caption; no decoding again
        cleared = menu.input(disable_download, None, [download], queue=False, **private)
        redrawn = cleared.then(callbacks.tracked(callbacks.redraw), [result, layer, head], shown, **cpu, **private)
        then_figure(redrawn, **private)
        redrawn.then(callbacks.tracked(callbacks.inside), inside_in, inside_out, **cpu, **private)
    grid_word.input(callbacks.tracked(callbacks.inside), inside_in, inside_out, **cpu, **private)
    model_name.change(callbacks.choose_model, [model_name], [layer, head, serving], queue=False, **private)


_CALLBACKS: weakref.WeakKeyDictionary[gr.Blocks, Callbacks] = weakref.WeakKeyDictionary()  # for `close` to wait


def wait_for_callbacks(demo: gr.Blocks, timeout: float) -> bool:
    """Wait until none of the page's callbacks runs; False if one still does after `timeout` seconds."""
    callbacks = _CALLBACKS.get(demo)
    return callbacks is None or callbacks.wait_idle(timeout)


def page_decoder(demo: gr.Blocks) -> Decoder | None:
    """What the captions of a page built by `build_demo` decode with (None for another page)."""
    callbacks = _CALLBACKS.get(demo)
    return callbacks.decoder if callbacks is not None else None


def batch_sizes(demo: gr.Blocks) -> dict[int, int]:
    """How many caption batches of each size the page decoded (empty for a page not built by `build_demo`)."""
    callbacks = _CALLBACKS.get(demo)
    return dict(sorted(callbacks.batcher.batch_sizes.items())) if callbacks is not None else {}
