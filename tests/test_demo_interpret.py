"""The demo's transformer views (self-attention head view, per-head maps) and model cards:
page logic without a server, then a real browser."""

from __future__ import annotations

import functools
import io
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import chromium_browser, never_stopping, require_module, tiny_model

require_module("gradio", "the demo extra is not installed (pip install -e .[demo])")

from captioner.apps.demo.cards import model_card  # noqa: E402
from captioner.apps.demo.page import caption_page, inside_views  # noqa: E402
from captioner.apps.demo.server import close, launch  # noqa: E402
from captioner.apps.demo.ui import Callbacks, build_demo  # noqa: E402
from captioner.data.shapes import generate_shapes  # noqa: E402
from captioner.models.checkpoint import load_captioner, read_checkpoint, save_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow
HISTORY = [
    {"epoch": 1, "step": 10, "val_BLEU4": 0.41, "val_CIDEr": 1.5},
    {"epoch": 2, "step": 20, "val_BLEU4": 0.52, "val_CIDEr": 2.25},
    {"epoch": 3, "step": 30, "val_BLEU4": 0.50, "val_CIDEr": 2.0},
]



@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Path]]:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("demo_interpret")
    generate_shapes(root / "shapes", 0, 0, 3, image_size=64, progress=False)
    lstm, transformer = root / "lstm.pt", root / "transformer.pt"
    state = {"epoch": 3, "best_epoch": 2, "best_score": 2.25, "history": HISTORY}
    save_checkpoint(lstm, never_stopping(tiny_model()), train_state=state)
    save_checkpoint(transformer,
                    never_stopping(tiny_model("model.decoder.type=transformer", "model.decoder.num_layers=2")))
    return lstm, transformer, sorted((root / "shapes" / "test").iterdir())


def test_model_card_says_dataset_vocabulary_and_best_validation(served) -> None:
    lstm, transformer, _ = served
    card = model_card(str(lstm), load_captioner(lstm), read_checkpoint(lstm))
    assert "shapes" in card and f"vocabulary {len(load_captioner(lstm).vocab)} words" in card
    assert "epoch 2 of 3" in card and "BLEU4 0.520" in card and "CIDEr 2.250" in card  # the best epoch's scores
    assert "no validation scores" in model_card(str(transformer), load_captioner(transformer),
                                                read_checkpoint(transformer))


def test_model_card_names_the_step_of_a_mid_epoch_best(tmp_path: Path) -> None:
    """With train.val_every_steps, epoch 2 has two validations: the card gives the best one's."""
    history = [*HISTORY[:1], {"epoch": 2, "step": 15, "epochs_done": 1.5, "val_BLEU4": 0.6, "val_CIDEr": 2.5},
               *HISTORY[1:]]
    path = tmp_path / "mid.pt"
    save_checkpoint(path, never_stopping(tiny_model()),
                    train_state={"epoch": 3, "best_epoch": 2, "best_step": 15, "best_score": 2.5, "history": history})
    card = model_card(str(path), load_captioner(path), read_checkpoint(path))
    assert "epoch 2, step 15 of 3" in card and "CIDEr 2.500" in card


def test_inside_views_follow_the_layer_head_and_word_choices(served, tmp_path: Path) -> None:
    lstm, transformer, images = served
    model = load_captioner(transformer)
    page = caption_page(model, "tiny", images[0], beam_size=2, max_length=6)
    image, caption = page.result.image, page.result.caption
    assert caption.self_attn is not None and caption.self_attn.shape[:2] == (len(caption.words), 2)
    view, grid = inside_views(image, caption, "1", "mean", "1: x")
    view_head, grid_word = inside_views(image, caption, "1", "2", f"3: {caption.words[2]}")
    assert view.width > 2 * view_head.width  # every head and the mean, against one head
    assert view.size != grid.size and np.abs(np.asarray(grid, float) - np.asarray(grid_word, float)).mean() > 0.1
    lstm_page = caption_page(load_captioner(lstm), "tiny", images[0], beam_size=2, max_length=6)
    assert inside_views(lstm_page.result.image, lstm_page.result.caption, "1", "mean", None) == (None, None)


def test_the_views_are_jpeg_files_that_the_prune_deletes_when_old(served, tmp_path: Path, monkeypatch) -> None:
    """The page shows the views from files of their own (Gradio would encode a WebP of each, 20 ms), and the prune
    that clears old overlays clears them too."""
    import os

    from captioner.apps.demo.page import prune

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "cache"))
    _, transformer, images = served
    callbacks = Callbacks({str(transformer): load_captioner(transformer)})
    _, _, _, _, result = callbacks.caption(str(images[0]), str(transformer), 2, 6, "2", "mean")
    view, grid, word = callbacks.inside(result, "2", "mean", None)
    paths = [Path(view["value"]), Path(grid["value"])]
    assert [path.name[:5] for path in paths] == ["view_", "view_"] and word["visible"]
    for path, picture in zip(paths, inside_views(result.image, result.caption, "2", "mean", None), strict=True):
        with Image.open(path) as saved:
            assert saved.format == "JPEG" and saved.size == picture.size
    for path in paths:
        os.utime(path, (time.time() - 100, time.time() - 100))
    prune(callbacks.out_dir, max_age_s=50)
    assert not any(path.exists() for path in paths)


# --- a real browser ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(chromium: Path):
    with chromium_browser(chromium) as browser:
        yield browser


SERVER_CALLS: list[str] = []  # what the page's callbacks were asked and answered, for a failure's message


@pytest.fixture(scope="module")
def server(served) -> Iterator[str]:
    import socket

    lstm, transformer, images = served
    with pytest.MonkeyPatch.context() as patch:  # the page binds the patched methods when built
        patch.setattr(Callbacks, "caption", recorded(Callbacks.caption))
        patch.setattr(Callbacks, "inside", recorded(slow_first_call(Callbacks.inside, seconds=4.0)))
        demo = build_demo([lstm, transformer], images[:2], decode_process=False)  # the views, not where they decode
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = launch(demo, "127.0.0.1", port, block=False)
    yield url
    close(demo)  # waits for the callbacks still drawing


def recorded(method):
    """`method`, noting in SERVER_CALLS when it was called, on what, and what it answered."""
    started = time.monotonic()

    def shown(value) -> str:
        if isinstance(value, dict):  # a gr.update
            return f"update(visible={value.get('visible')}, value={type(value.get('value')).__name__})"
        if hasattr(value, "caption") and hasattr(value, "model_name"):  # a kept Result
            return f"Result({Path(value.model_name).name}: {value.caption.text[:30]!r})"
        if isinstance(value, str) and "/" in value:  # an upload or a checkpoint: its name says enough
            return Path(value).name
        return repr(value)[:60]

    @functools.wraps(method)  # Gradio reads the signature for the API
    def call(self, *args):
        begun = time.monotonic() - started
        try:
            answer = method(self, *args)
        except BaseException as e:
            SERVER_CALLS.append(f"{begun:.1f}s {method.__name__}{[shown(a) for a in args]} raised {e!r}")
            raise
        SERVER_CALLS.append(f"{begun:.1f}-{time.monotonic() - started:.1f}s "
                            f"{method.__name__}{[shown(a) for a in args]} -> {[shown(a) for a in answer]}")
        return answer

    return call


def wait_visible(page, selector: str) -> None:
    """Wait for `selector` to show; if it never does, fail with what the page and the server did."""
    try:
        page.wait_for_selector(selector, state="visible", timeout=60_000)
    except Exception as e:  # playwright's TimeoutError
        fields = {
            name: page.evaluate(f"document.querySelector({css!r})?.{prop} ?? null")
            for name, css, prop in [
                ("caption", "#caption textarea", "value"), ("note", "#note", "innerText"),
                ("score", "#score", "innerText"),
                ("model", "#model input", "value"), ("layer", "#layer input", "value"),
            ]
        }
        raise AssertionError(f"{selector} never showed ({e.__class__.__name__}); page: {fields}; server calls:\n"
                             + "\n".join(SERVER_CALLS)) from None


def slow_first_call(method, seconds: float):
    """`method`, whose first call takes `seconds` longer: the first caption's views are still
    being drawn when the next caption arrives, as on a loaded machine."""
    calls = iter(range(1_000_000))

    @functools.wraps(method)
    def slow(*args, **kwargs):
        if next(calls) == 0:
            time.sleep(seconds)
        return method(*args, **kwargs)

    return slow


def image_src(page, selector: str) -> str:
    page.wait_for_selector(f"{selector} img", timeout=60_000)
    return page.locator(f"{selector} img").first.get_attribute("src")


def test_browser_shows_model_cards_head_view_and_per_head_maps(browser, server: str, served) -> None:
    _, _, images = served
    page = browser.new_page(viewport={"width": 1280, "height": 1400})
    page.goto(server)
    page.wait_for_selector("#run")
    card = page.inner_text("#model_card")
    assert card.count("trained on shapes") == 2 and "BLEU4 0.520" in card and "vocabulary" in card

    page.set_input_files("#image input[type=file]", str(images[0]))
    page.wait_for_selector(f"#image img[src$='{images[0].name}']")
    page.click("#run")  # the LSTM: no self-attention, no transformer views
    page.wait_for_function("document.querySelector('#caption textarea').value.length > 0", timeout=60_000)
    page.wait_for_timeout(1500)
    assert not page.is_visible("#head_view") and not page.is_visible("#head_grid")

    page.click("#model input")
    page.get_by_role("option", name="transformer.pt", exact=False).click()
    page.wait_for_selector("#layer", state="visible")
    page.click("#run")
    wait_visible(page, "#head_view")
    view = image_src(page, "#head_view")
    grid = image_src(page, "#head_grid")
    words = page.input_value("#caption textarea").split()
    assert page.input_value("#grid_word input") == f"1: {words[0]}"
    picture = Image.open(io.BytesIO(page.request.get(view).body()))  # every head of the layer and their mean

    page.click("#grid_word input")  # another word: its layers x heads maps
    page.get_by_role("option", name=f"2: {words[1]}", exact=True).click()
    page.wait_for_function(f"document.querySelector('#head_grid img')?.src !== {grid!r}", timeout=60_000)
    page.click("#head input")  # one head: the head view narrows to it
    page.get_by_role("option", name="2", exact=True).click()
    # Each drawing is a file of a new name, so the view's address changes with every step (the word's too):
    # wait for the narrow picture itself.
    deadline = time.monotonic() + 60
    while True:
        narrow = Image.open(io.BytesIO(page.request.get(image_src(page, "#head_view")).body()))
        if narrow.width < picture.width / 2 or time.monotonic() > deadline:
            break
        page.wait_for_timeout(200)
    assert narrow.width < picture.width / 2
    assert "Traceback" not in page.content()
    page.close()  # its open connections would hold up the server's shutdown
