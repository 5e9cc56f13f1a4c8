"""Every /caption request value is checked by the demo's own callback, not only by Gradio.

A request with beam 10,000 and length 100,000 must be answered at once with a message, and the
next ordinary request served as usual: called directly (no Gradio range check at all), through
the API of a launched demo on 127.0.0.1, and through the API of a demo whose sliders no longer
check their range (what a Gradio upgrade or a change of component could bring).
"""

from __future__ import annotations

import base64
import json
import math
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import never_stopping, require_module, serving, tiny_model  # noqa: E402
from PIL import Image

require_module("gradio", "the demo extra is not installed (pip install -e .[demo])")

from captioner.apps.demo.cards import load_models  # noqa: E402
from captioner.apps.demo.page import MAX_BEAM, MAX_LENGTH, MEAN, check_request  # noqa: E402
from captioner.apps.demo.server import close, launch  # noqa: E402
from captioner.apps.demo.ui import Callbacks, build_demo  # noqa: E402
from captioner.core.errors import RequestError  # noqa: E402
from captioner.data.image_files import load_image  # noqa: E402
from captioner.models.captioner import Captioner  # noqa: E402
from captioner.models.checkpoint import load_captioner, save_checkpoint  # noqa: E402

HUGE_BEAM, HUGE_LENGTH = 10_000, 100_000
AT_ONCE_S = 5.0  # a refusal decodes nothing; decoding beam 10,000 to length 100,000 would take hours


@dataclass
class Models:
    lstm: Path
    transformer: Path  # 2 layers, 2 heads
    image: Path



@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("requests")
    save_checkpoint(root / "lstm.pt", never_stopping(tiny_model()))
    save_checkpoint(root / "transformer.pt",
                    never_stopping(tiny_model("model.decoder.type=transformer", "model.decoder.num_layers=2")))
    picture = np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    Image.fromarray(picture).save(root / "photo.png")
    return Models(root / "lstm.pt", root / "transformer.pt", root / "photo.png")


def expected_text(checkpoint: Path, image: Path, beam: int, length: int) -> str:
    return load_captioner(checkpoint).caption(load_image(image), beam_size=beam, max_length=length).text


# --- the check itself ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("beam", "length", "layer", "head", "message"),
    [
        (HUGE_BEAM, 12, None, None, r"^beam_size must be a whole number in \[1, 10\]; got 10000$"),
        (3, HUGE_LENGTH, None, None, r"^max_length must be a whole number in \[1, 60\]; got 100000$"),
        (0, 12, None, None, "beam_size .* got 0"),
        (-1, 12, None, None, "beam_size .* got -1"),
        (2.5, 12, None, None, "beam_size .* got 2.5"),
        (math.nan, 12, None, None, "beam_size .* got nan"),
        (math.inf, 12, None, None, "beam_size .* got inf"),
        (True, 12, None, None, "beam_size .* got True"),
        ("3", 12, None, None, "beam_size .* got '3'"),
        (None, 12, None, None, "beam_size .* got None"),
        (3, 0, None, None, "max_length .* got 0"),
        (3, 12.5, None, None, "max_length .* got 12.5"),
        (3, 12, "3", None, "decoder layer must be one of 1, 2 for this model, got '3'"),
        (3, 12, "0", None, "decoder layer .* got '0'"),
        (3, 12, ["1"], None, "decoder layer .* got \"\\['1'\\]\""),
        (3, 12, "2", "3", "attention head must be one of mean, 1, 2 for this model, got '3'"),
        (3, 12, "2", "max", "attention head .* got 'max'"),
    ],
)
def test_out_of_range_values_are_refused_by_name(models: Models, beam, length, layer, head, message: str) -> None:
    loaded = load_models([models.transformer])
    with pytest.raises(RequestError, match=message):
        check_request(loaded, str(models.transformer), beam, length, layer, head)


def test_page_values_pass_and_defaults_fill_in(models: Models) -> None:
    loaded = load_models([models.lstm, models.transformer])
    request = check_request(loaded, str(models.transformer), 3.0, 12.0, 2, 1)  # slider floats, numeric menus
    assert (request.beam_size, request.max_length, request.layer, request.head) == (3, 12, "2", "1")
    assert type(request.beam_size) is int and type(request.max_length) is int
    request = check_request(loaded, None, MAX_BEAM, MAX_LENGTH, None, "")
    assert (request.model_name, request.layer, request.head) == (str(models.lstm), None, MEAN)
    with pytest.raises(RequestError, match="unknown model '/etc/other.pt'"):
        check_request(loaded, "/etc/other.pt", 3, 12, None, None)
    with pytest.raises(RequestError, match="decoder layer must be one of 1 for this model"):
        check_request(loaded, str(models.lstm), 3, 12, "2", None)  # the transformer's layer, the LSTM chosen


# --- the callback, with no Gradio in front of it -------------------------------------------------


def test_callback_refuses_a_huge_request_at_once_then_serves_the_next(models: Models,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    callbacks = Callbacks(load_models([models.lstm, models.transformer]))
    decoded: list[int] = []
    original = Captioner.decode
    monkeypatch.setattr(Captioner, "decode", lambda self, *a, **k: decoded.append(1) or original(self, *a, **k))
    name = str(models.transformer)

    started = time.perf_counter()
    text, score, gallery, note, result = callbacks.caption(str(models.image), name, HUGE_BEAM, HUGE_LENGTH, "2", MEAN)
    assert time.perf_counter() - started < AT_ONCE_S and not decoded
    assert (text, score, gallery, result) == ("", "", [], None)
    assert note == "**Request refused.** beam_size must be a whole number in [1, 10]; got 10000"

    for bad in [(name, 3, 12, "9", MEAN), ("nobody.pt", 3, 12, None, MEAN), (name, 3, -5, None, MEAN)]:
        assert callbacks.caption(str(models.image), *bad)[3].startswith("**Request refused.**")
    assert callbacks.caption(["not", "a", "file"], name, 3, 12, None,
                             MEAN)[3].startswith("**Request refused.** the image")
    assert not decoded

    text, score, gallery, note, result = callbacks.caption(str(models.image), name, 3, 12, "2", "1")
    assert decoded and text and text == expected_text(models.transformer, models.image, 3, 12)
    assert "layer 2, head 1" in score and len(gallery) == len(result.caption.words) and "refused" not in note


# --- through the API of a launched demo ----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(models: Models, widen_sliders: bool) -> Iterator[str]:
    # Decoding in the server's threads: these tests are about the callback's checks, and a decoding process of
    # its own costs each server 3-4 s of CPU to start (tests/test_demo_decoding.py and test_demo.py test it).
    demo = build_demo([models.lstm, models.transformer], [], decode_process=False)
    if widen_sliders:  # as if Gradio stopped checking the sliders' range: only the callback is left
        for block in demo.blocks.values():
            if getattr(block, "elem_id", None) in ("beam", "max_length"):
                block.maximum = 10**9
                block.minimum = -(10**9)
    url = launch(demo, "127.0.0.1", free_port(), block=False)
    try:
        yield url
    finally:
        close(demo)  # waits for captions in flight: a worker left inside torch aborts the exit


@pytest.fixture(scope="module")
def server(models: Models) -> Iterator[str]:
    yield from serve(models, widen_sliders=False)


@pytest.fixture(scope="module")
def unchecked_server(models: Models) -> Iterator[str]:
    yield from serve(models, widen_sliders=True)


def client(url: str, tmp_path: Path):
    from gradio_client import Client

    return Client(url, verbose=False, analytics_enabled=False, download_files=str(tmp_path))


def ask(url: str, tmp_path: Path, models: Models, beam: float, length: float) -> tuple[float, tuple | Exception]:
    from gradio_client import handle_file

    api = client(url, tmp_path)
    started = time.perf_counter()
    try:
        answer: tuple | Exception = tuple(
            api.predict(handle_file(str(models.image)), model_name=str(models.lstm), beam_size=beam, max_length=length,
                        api_name="/caption")
        )
    except Exception as e:  # noqa: BLE001 - Gradio's own refusal reaches the client as an exception
        answer = e
    return time.perf_counter() - started, answer


def test_api_huge_request_is_answered_at_once_then_the_next_is_served(server: str, models: Models,
                                                                      tmp_path: Path) -> None:
    """The callback answers (the sliders hand it their values untouched); whichever answers, at once and in words."""
    seconds, answer = ask(server, tmp_path, models, HUGE_BEAM, HUGE_LENGTH)
    assert seconds < AT_ONCE_S
    message = str(answer) if isinstance(answer, Exception) else answer[3]
    assert "10000" in message and ("greater than maximum" in message or "Request refused" in message), message
    seconds, answer = ask(server, tmp_path, models, 3, 12)
    assert not isinstance(answer, Exception), answer
    assert answer[0] == expected_text(models.lstm, models.image, 3, 12) and "refused" not in answer[3]


def test_api_values_gradios_components_refuse_are_answered_in_words_without_a_traceback(
        server: str, models: Models, tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """A slider value out of range or of the wrong type reaches the callback's check (Gradio's printed a traceback
    in the server's log, and for "abc" or null gave the page no words); a value no menu offers is one line."""
    from gradio_client import handle_file

    for beam in (0, "abc", None):
        _, answer = ask(server, tmp_path, models, beam, 12)
        assert not isinstance(answer, Exception), answer
        assert answer[3] == f"**Request refused.** beam_size must be a whole number in [1, 10]; got {beam!r}"
    with pytest.raises(Exception, match=r"^Request refused: '9' is not one of the Decoder layer menu's choices$"):
        client(server, tmp_path).predict(handle_file(str(models.image)), model_name=str(models.transformer),
                                         layer="9", api_name="/caption")
    assert "Traceback" not in capfd.readouterr().err


FILE_DATA = {"_type": "gradio.FileData"}  # what the page and gradio_client mark an uploaded file's value with
NOT_UPLOADED = "Request refused: the image must be an uploaded file, got "


def call(url: str, image: object, model: Path) -> tuple[str, object]:
    """/caption over Gradio's plain HTTP API, the image value sent as it is: the stream's last event and data."""
    import httpx

    started = httpx.post(f"{url}gradio_api/call/caption", json={"data": [image, str(model), 3, 12, None, MEAN]})
    stream = httpx.get(f"{url}gradio_api/call/caption/{started.json()['event_id']}", timeout=60).text
    event, data = [line.partition(": ")[2] for line in stream.strip().splitlines()[-2:]]
    return event, json.loads(data)


class Fetched(BaseHTTPRequestHandler):
    paths: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        Fetched.paths.append(self.path)
        self.send_error(404)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_api_image_values_never_uploaded_are_refused_in_words_and_nothing_is_read_or_fetched(
        server: str, models: Models, tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """An int, a path or URL, a dict of other fields, a data URL, a file outside Gradio's upload folder (by
    `..` or a link): refused in one line naming the image, before Gradio's file handling, whose refusals were a
    traceback in the log and `{"error": null}` for the caller (a dict without "meta" it let through, and the
    photo outside the cache was captioned); an upload sent the same way is captioned as before."""
    import httpx
    from gradio.utils import get_upload_folder

    cache = Path(get_upload_folder())
    link = cache / f"link-{tmp_path.name}.png"  # in the upload folder, leading out of it
    link.symlink_to(models.image)
    photo, escaped = str(models.image), f"{cache}/{os.path.relpath(models.image, cache)}"  # cache/../..
    data_url = "data:image/png;base64," + base64.b64encode(models.image.read_bytes()).decode()
    try:
        with serving(Fetched) as site:
            cases = [
                (5, "int 5"), (["a"], "list ['a']"), ({"foo": 1}, "dict {'foo': 1}"), ({"url": data_url}, "a data URL"),
                ("/etc/passwd", "the path '/etc/passwd'"), ({"path": "/etc/passwd"}, "the path '/etc/passwd'"),
                ({"path": photo}, "the path "), ({"path": photo, "meta": FILE_DATA}, "the path "),
                ({"path": escaped, "meta": FILE_DATA}, "the path "), ({"path": str(link)}, "the path "),
                ({"path": 3, "meta": FILE_DATA}, "dict "), ({"path": photo, "meta": 5}, "the path "),
                (f"{site}/a.png", f"the URL '{site}/a.png'"), ({"url": f"{site}/b.png"}, f"the URL '{site}/b.png'"),
                ({"path": f"{site}/c.png", "meta": FILE_DATA}, f"the URL '{site}/c.png'"),
            ]
            for image, got in cases:
                event, data = call(server, image, models.lstm)
                assert event == "error" and str(data["error"]).startswith(NOT_UPLOADED + got), (image, data)
                assert "\n" not in data["error"] and len(data["error"]) < 200
            with pytest.raises(Exception, match=rf"^{NOT_UPLOADED}int 5$"):
                client(server, tmp_path).predict(5, api_name="/caption")
        assert not Fetched.paths
        assert "Traceback" not in capfd.readouterr().err
    finally:
        link.unlink()

    with models.image.open("rb") as f:
        upload = httpx.post(f"{server}gradio_api/upload", files={"files": f}).json()[0]
    for image in ({"path": upload, "meta": FILE_DATA, "orig_name": "photo.png"}, {"path": upload}, None):
        event, data = call(server, image, models.lstm)
        assert event == "complete", (image, data)
        assert data[0] == (expected_text(models.lstm, models.image, 3, 12) if image else ""), (image, data)


def test_api_without_gradio_range_check_the_callback_refuses(unchecked_server: str, models: Models,
                                                             tmp_path: Path) -> None:
    seconds, answer = ask(unchecked_server, tmp_path, models, HUGE_BEAM, HUGE_LENGTH)
    assert seconds < AT_ONCE_S and not isinstance(answer, Exception), answer
    text, _, gallery, note = answer
    assert ((text, gallery) == ("", []) and note
            == "**Request refused.** beam_size must be a whole number in [1, 10]; got 10000")
    seconds, answer = ask(unchecked_server, tmp_path, models, 3, HUGE_LENGTH)
    assert answer[3] == "**Request refused.** max_length must be a whole number in [1, 60]; got 100000"
    _, answer = ask(unchecked_server, tmp_path, models, 3, 12)
    assert answer[0] == expected_text(models.lstm, models.image, 3, 12) and "refused" not in answer[3]
