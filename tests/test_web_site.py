"""`captioner export --web`: the static site captions in a real browser (headless Chromium, onnxruntime-web's
wasm) as the Python runtime captions with the same graphs: the packaged model on the golden Flickr8k photographs,
from the preprocessed tensors (same tokens, maps to 1e-4) and from the files (at least 11 of 12 the same). A
model whose words are HTML shows them as text and runs nothing; a corrupt graph or manifest, a file that is not
an image or one too large is one clear message; the page asks nothing of any origin but its own."""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import runpy
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import REPO, chromium_browser, edit_json, require, serving, tiny_config, tiny_vocab

pytestmark = pytest.mark.xdist_group("web_site")  # one worker builds the sites and starts the browser once

ORT = REPO / "node_modules" / "onnxruntime-web"
EXPECTED = REPO / "tests" / "data" / "packaged_captions.json"
# Words carry no space or control character (a model's vocabulary refuses them), so the markup is the kind that needs
# none: `/` parts an element's attributes as a space does.
HOSTILE = ["<img/src/onerror=window.pwned=1>", "</script><script>window.pwned=2</script>", "&amp;", "\u00e9t\u00e9"]


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def serve() -> Iterator:
    """serve(folder) -> the URL of an HTTP server for `folder` (stopped after the module)."""
    with contextlib.ExitStack() as servers:
        yield lambda folder: servers.enter_context(serving(functools.partial(Quiet, directory=str(folder)))) + "/"


@pytest.fixture(scope="module")
def browser(chromium: Path):
    with chromium_browser(chromium) as browser:
        yield browser


@pytest.fixture(scope="module")
def packaged_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packaged model's site, onnxruntime-web copied in (`--ort`), as `captioner export --web` writes it."""
    require(ORT.is_dir(), f"{ORT} not found (npm ci in the repository installs it)")
    from captioner.apps.web_site import write_site
    from captioner.models.checkpoint import default_model

    folder = tmp_path_factory.mktemp("site") / "packaged"
    write_site(default_model("cpu"), folder, ort=ORT)
    return folder


def hostile_model():
    """A tiny model whose words are HTML and script, made to say them (its output bias favours them)."""
    from captioner.models.captioner import Captioner
    from captioner.text.vocab import Vocabulary

    vocab = Vocabulary([*tiny_vocab().words, *HOSTILE])
    torch.manual_seed(0)
    model = Captioner.from_config(tiny_config("decode.max_length=6", "decode.beam_size=1"), vocab).eval()
    with torch.no_grad():
        model.decoder.out_vocab.bias[-len(HOSTILE):-2] += 50.0  # the two HTML words
    return model


@pytest.fixture(scope="module")
def hostile_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(ORT.is_dir(), f"{ORT} not found (npm ci in the repository installs it)")
    from captioner.apps.web_site import write_site

    folder = tmp_path_factory.mktemp("site") / "hostile"
    write_site(hostile_model(), folder, ort=ORT)
    return folder


def open_page(browser, url: str, requests: list[str] | None = None):
    page = browser.new_page()
    if requests is not None:
        page.on("request", lambda request: requests.append(request.url))
    page.goto(url + "index.html")
    page.wait_for_selector("body[data-ready]", timeout=60_000)
    return page


def golden_photos(shared_data: Path) -> list[Path]:
    script = runpy.run_path(str(REPO / "scripts" / "packaged_captions.py"))
    names = list(json.loads(EXPECTED.read_text())["captions"])
    return script["test_photos"](shared_data / "flickr8k" / "images",
                                 shared_data / "flickr8k" / "Flickr_8k.testImages.txt", len(names))


def test_the_page_captions_as_the_python_runtime_with_the_same_graphs(browser, serve, packaged_site: Path,
                                                                       shared_data: Path, tmp_path: Path) -> None:
    from captioner.data.image_files import load_image
    from captioner.deploy.runtime import OnnxCaptioner, image_array

    runtime = OnnxCaptioner.from_folder(packaged_site / "model")
    photos = golden_photos(shared_data)
    pixels = [image_array(load_image(photo), runtime.image_size) for photo in photos]  # (3, S, S) each
    expected = [runtime.caption_arrays(p[None])[0] for p in pixels]
    assert json.loads((packaged_site / "site.json").read_text())["weights"] == "float16"
    # The site's float16-stored weights caption the golden photographs as the float32 graphs do.
    from captioner.models.checkpoint import default_model
    from captioner.models.onnx_export import export_onnx

    export_onnx(default_model("cpu"), tmp_path)
    full = OnnxCaptioner.from_folder(tmp_path)
    assert [c.text for c in expected] == [full.caption_arrays(p[None])[0].text for p in pixels]
    requests: list[str] = []
    url = serve(packaged_site)
    page = open_page(browser, url, requests)
    assert page.evaluate("document.body.dataset.ready") == "true", page.text_content("#error")
    for photo, array, want in zip(photos, pixels, expected, strict=True):
        # the pixels as base64, not a list: Playwright passes a list's 150,000 numbers one by one (1 s a photo)
        got = page.evaluate("async (b64) => { const p = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));"
                            " const r = await window.captioner.captionPixels(p);"
                            " return {tokens: r.tokens, attn: Array.from(r.attn), dims: r.attnDims}; }",
                            base64.b64encode(array.tobytes()).decode())
        assert got["tokens"] == want.tokens, photo.name
        attn = np.asarray(got["attn"], dtype=np.float32).reshape(got["dims"])  # (T, L, H, N)
        np.testing.assert_allclose(attn, want.attn.reshape(attn.shape), atol=1e-4, err_msg=photo.name)
    said = []
    for photo in photos:
        page.set_input_files("#file", str(photo))
        page.wait_for_function("(name) => document.body.dataset.busy === 'false' && "
                               "document.getElementById('status').textContent.startsWith(name)", arg=photo.name)
        said.append(" ".join(page.locator("#caption .word").all_text_contents()))
    same = sum(s == w.text for s, w in zip(said, expected))
    assert same >= 11, list(zip(said, [w.text for w in expected]))
    assert len(page.locator("#maps .map").all()) == len(expected[-1].words)  # one map per word
    view = "() => document.getElementById('view').toDataURL()"
    mean_of_heads = page.evaluate(view)
    page.select_option("#head", "0")
    one_head = page.evaluate(view)
    page.locator("#caption .word").nth(1).click()
    assert len({mean_of_heads, one_head, page.evaluate(view)}) == 3  # the head and the word each redraw the map
    assert all(r.startswith(url) for r in requests), [r for r in requests if not r.startswith(url)]
    page.close()


def test_a_hostile_vocabulary_is_shown_as_text_and_runs_nothing(browser, serve, hostile_site: Path) -> None:
    page = open_page(browser, serve(hostile_site))
    assert page.evaluate("document.body.dataset.ready") == "true", page.text_content("#error")
    page.click("#examples button")
    page.wait_for_selector("#caption .word")
    words = page.locator("#caption .word").all_text_contents()
    assert set(words) & set(HOSTILE[:2]), words  # the HTML words were written, as text
    assert page.locator("#caption img, #caption script, #maps img").count() == 0
    assert page.evaluate("window.pwned") is None
    page.close()


@pytest.mark.parametrize("broken", ["model/decoder_step.onnx", "model/onnx.json"])
def test_a_corrupt_model_file_is_one_clear_message(browser, serve, hostile_site: Path, tmp_path: Path,
                                                   broken: str) -> None:
    site = shutil.copytree(hostile_site, tmp_path / "site")
    data = (site / broken).read_bytes()
    (site / broken).write_bytes(data[: len(data) // 2])
    page = open_page(browser, serve(site))
    assert page.evaluate("document.body.dataset.ready") == "failed"
    message = page.text_content("#error")
    assert "\n" not in message.strip() and Path(broken).name in message, message
    page.close()


@pytest.mark.parametrize("field, value", [("model/onnx.json", {"files.decoder_step.path": "../../x.onnx"}),
                                          ("site.json", {"ort.url": "https://example.org/ort/"}),
                                          ("site.json", {"model": "https://example.org/onnx.json"})])
def test_a_site_that_points_elsewhere_is_refused(browser, serve, hostile_site: Path, tmp_path: Path, field: str,
                                                 value: dict) -> None:
    """The page loads code and graphs from its own origin (and the pinned CDN) only, whatever its JSON says."""
    site = shutil.copytree(hostile_site, tmp_path / "site")
    edit_json(site / field, value)
    requests: list[str] = []
    page = open_page(browser, serve(site), requests)
    assert page.evaluate("document.body.dataset.ready") == "failed"
    assert "example.org" not in " ".join(requests) and "x.onnx" not in " ".join(requests)
    assert page.text_content("#error").split(":")[0] in ("onnx.json", "site.json"), page.text_content("#error")
    page.close()


def test_a_file_that_is_not_an_image_or_too_large_is_refused_in_one_line(browser, serve, hostile_site: Path,
                                                                         tmp_path: Path) -> None:
    page = open_page(browser, serve(hostile_site))
    (tmp_path / "notes.jpg").write_text("not a picture")
    page.set_input_files("#file", str(tmp_path / "notes.jpg"))
    page.wait_for_selector("#error:not([hidden])")
    assert page.text_content("#error") == "notes.jpg: not an image this browser can read"
    page.evaluate("window.captioner.captionFile(new File([new Uint8Array(31 * 1024 * 1024)], 'huge.png'))")
    page.wait_for_function("() => document.getElementById('error').textContent.startsWith('huge.png')")
    assert page.text_content("#error") == "huge.png: 32.5 MB, over the limit of 30 MB"
    Image.new("1", (9000, 6000)).save(tmp_path / "bomb.png")  # 54 megapixels in a few kilobytes
    page.set_input_files("#file", str(tmp_path / "bomb.png"))
    page.wait_for_function("() => document.getElementById('error').textContent.startsWith('bomb.png')")
    assert page.text_content("#error") == ("bomb.png: image is 9000x6000 = 54 megapixels, over the limit of 50 "
                                           "(possible decompression bomb)")
    page.close()


def test_without_ort_the_page_names_the_cdn_and_asks_nothing_else(browser, serve, tmp_path: Path) -> None:
    """A site written without --ort loads onnxruntime-web from the CDN (here unreachable: one message
    naming it), and asks nothing of any origin but its own and the CDN's."""
    from captioner.apps.web_site import ORT_CDN, write_site

    site = tmp_path / "cdn_site"
    write_site(hostile_model(), site)
    assert json.loads((site / "site.json").read_text())["ort"] == {"version": "1.30.0", "source": "cdn",
                                                                   "url": ORT_CDN}
    assert not (site / "ort").exists()
    requests: list[str] = []
    page = browser.new_page()
    page.route("https://**", lambda route: route.abort())  # no internet in CI: say so at once
    page.on("request", lambda request: requests.append(request.url))
    url = serve(site)
    page.goto(url + "index.html")
    page.wait_for_selector("body[data-ready='failed']", timeout=60_000)
    assert page.text_content("#error").startswith(f"onnxruntime-web could not be loaded from {ORT_CDN}")
    assert {r.split("/")[2] for r in requests} == {url.split("/")[2], "cdn.jsdelivr.net"}, requests
    page.close()

