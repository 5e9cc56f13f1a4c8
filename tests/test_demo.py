"""The demo: page logic on awkward uploads, the API through gradio_client, and a real browser.

The session's tiny LSTM (conftest.py `shapes_lstm`, trained once for the end-to-end tests too)
gives real captions with real attention; a tiny random transformer stands in for a multi-layer,
multi-head model. Every server is stopped with `captioner.apps.demo.server.close`, which waits
for the captions it is still computing: a worker thread left inside torch aborts the interpreter at exit.
"""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (chromium_browser, count_panels, never_stopping, require_module, subprocess_env,  # noqa: E402
                     tiny_model)
import warm_start
from PIL import Image

require_module("gradio", "the demo extra is not installed (pip install -e .[demo])")

from conftest import TrainedRun  # noqa: E402

from captioner.apps.demo.cards import dataset_examples  # noqa: E402
from captioner.apps.demo.page import MEAN, Result, attention_choices, caption_page, render_page  # noqa: E402
from captioner.apps.demo.decoding import LocalDecoder  # noqa: E402
from captioner.apps.demo import server as demo_server  # noqa: E402
from captioner.apps.demo.server import close, default_checkpoint, launch  # noqa: E402
from captioner.apps.demo.ui import Callbacks, build_demo, enable_download  # noqa: E402
from captioner.core.config import load_config  # noqa: E402
from captioner.core.errors import CaptionerError, CheckpointError  # noqa: E402
from captioner.data.image_files import load_image  # noqa: E402
from captioner.core.decode_results import Caption  # noqa: E402
from captioner.models.checkpoint import load_captioner, save_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
MAX_LENGTH = 20  # the session model's decode.max_length (the page's default): its captions end before it

@dataclass
class Trained:
    checkpoint: Path  # the tiny LSTM
    transformer: Path  # a tiny random transformer (2 layers, 2 heads)
    images: list[Path]  # shapes test images


@pytest.fixture(scope="module")
def trained(shapes_lstm: TrainedRun, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    transformer = tmp_path_factory.mktemp("demo") / "transformer.pt"
    save_checkpoint(transformer,
                    never_stopping(tiny_model("model.decoder.type=transformer", "model.decoder.num_layers=2")))
    return Trained(shapes_lstm.checkpoint, transformer, shapes_lstm.test_images)



@pytest.fixture(scope="module")
def model(trained: Trained):
    return load_captioner(trained.checkpoint)


def page_for(model, upload, tmp_path: Path, **options):
    return caption_page(model, "tiny", upload, beam_size=3, max_length=MAX_LENGTH, figure_dir=tmp_path, **options)


# --- page logic --------------------------------------------------------------------------------


def cli_captions(checkpoint: Path, images: list[Path], capsys: pytest.CaptureFixture[str], beam: int,
                 length: int) -> list[dict]:
    """What `captioner caption CHECKPOINT IMAGES --json` prints: the independent path to compare
    the page with (its own model loaded from the file, the batched `caption` decoding)."""
    from captioner.apps.cli import main

    capsys.readouterr()  # drop what earlier calls printed
    assert main(["caption", str(checkpoint), *map(str, images), "--beam", str(beam), "--max-length", str(length),
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["image"] for row in rows] == [str(p) for p in images]
    return rows


def test_caption_page_says_what_the_cli_says_for_the_same_file_and_options(
    model, trained: Trained, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page's caption, word for word, is what `captioner caption --json` prints for the same
    upload with the same options. The uploads are stored sideways with an EXIF tag to turn them
    upright, and the options (beam 2, 5 words) are not the model's defaults (beam 3, 20 words);
    the image is one where each of these changes the caption, so a page that captioned the
    pixels as stored, ignored the beam or the length, or rewrote the text would not match."""
    beam, length = 2, 5
    uploads, as_stored = [], []
    for i, image in enumerate(trained.images):
        upright = Image.open(image).convert("RGB")
        exif = Image.Exif()
        exif[0x0112] = 6  # orientation: turn 90 degrees clockwise to view
        upload = tmp_path / f"sideways_{i}.jpg"
        upright.transpose(Image.Transpose.ROTATE_90).save(upload, quality=95, exif=exif)
        uploads.append(upload)
        as_stored.append(tmp_path / f"as_stored_{i}.png")  # the same pixels, without the tag
        Image.open(upload).convert("RGB").save(as_stored[-1])
    asked = cli_captions(trained.checkpoint, uploads, capsys, beam, length)
    other_beam = cli_captions(trained.checkpoint, uploads, capsys, model.decode_config.beam_size, length)
    other_length = cli_captions(trained.checkpoint, uploads, capsys, beam, model.decode_config.max_length)
    not_turned = cli_captions(trained.checkpoint, as_stored, capsys, beam, length)
    telling = [
        i for i, row in enumerate(asked)
        if row["caption"] not in (other_beam[i]["caption"], other_length[i]["caption"], not_turned[i]["caption"])
    ]
    assert telling, "no test image whose caption changes with the beam, the length and the orientation"
    upload, expected = uploads[telling[0]], asked[telling[0]]

    page = caption_page(model, "tiny", upload, beam_size=beam, max_length=length, figure_dir=tmp_path)
    assert page.text == expected["caption"]
    words = expected["caption"].split()
    score = float(page.score_line.removeprefix("score ").split(" ", 1)[0])
    assert abs(score - expected["score"]) < 6e-4 and f"· beam {beam} ·" in page.score_line  # the CLI rounds to 4 places
    assert [word for _, word in page.gallery] == words
    upright_size = Image.open(trained.images[telling[0]]).size
    assert all(overlay.size == upright_size for overlay, _ in page.gallery)
    assert page.figure is not None and Image.open(page.figure).format == "JPEG"
    assert count_panels(page.figure) == 1 + len(words)  # the input, then a panel per word
    cut = ("" if expected["finished"]
           else f" The caption reached the maximum length ({length} words) before the model ended it.")
    assert page.note == "Turned upright as its EXIF orientation says." + cut


def write_huge_png(path: Path, width: int, height: int) -> None:
    """A valid PNG header announcing width x height over one byte of data: a decompression bomb
    that costs nothing to make."""
    buffer = io.BytesIO()
    Image.new("L", (1, 1)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    data[16:24] = struct.pack(">II", width, height)  # IHDR width, height
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))  # the chunk's CRC
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "name, make, message",
    [
        ("notes.jpg", lambda p: p.write_text("not a picture"), "notes.jpg: not an image file"),
        ("empty.png", lambda p: p.write_bytes(b""), "empty.png: empty file (0 bytes)"),
        ("cut.jpg", None, "cut.jpg: corrupt or truncated"),
        ("bomb.png", lambda p: write_huge_png(p, 8000, 8000),
         "bomb.png: image is 8000x8000 = 64 megapixels, over the limit"),
    ],
)
def test_bad_uploads_get_a_clear_message(model, trained: Trained, tmp_path: Path, name: str, make,
                                         message: str) -> None:
    upload = tmp_path / "upload" / name
    upload.parent.mkdir()
    if make is None:
        upload.write_bytes(trained.images[0].read_bytes()[:400])
    else:
        make(upload)
    page = page_for(model, upload, tmp_path)
    assert page.text == "" and page.gallery == [] and page.figure is None and page.result is None
    assert page.note.startswith("**Could not caption this file.**") and message in page.note
    assert str(upload.parent) not in page.note  # the file's name, not the server's temporary path
    assert "Traceback" not in page.note


WITHOUT_GRADIO = """
import sys
sys.modules["gradio"] = None  # any import of Gradio now fails
from captioner.apps.demo import caption_page, dataset_examples, load_models
from captioner.apps.demo.page import check_request, render_page
from captioner.apps.cli import main
sys.exit(main(["demo", "missing.pt"]))
"""


def test_page_logic_needs_no_gradio_and_the_command_says_it_is_missing() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", WITHOUT_GRADIO], capture_output=True, text=True, timeout=120, cwd=REPO,
                          check=False)
    assert done.returncode == 2, done.stderr[-2000:]  # the imports passed; `captioner demo` refused in one line
    assert done.stderr.strip() == "error: demo: Gradio is not installed (pip install -e '.[demo]')"


def test_no_upload_asks_for_one(model, tmp_path: Path) -> None:
    assert "Upload an image" in page_for(model, None, tmp_path).note


def test_animated_gif_is_captioned_from_its_first_frame(model, trained: Trained, tmp_path: Path) -> None:
    first = Image.open(trained.images[0]).convert("RGB")
    frames = [first, Image.new("RGB", first.size, "white"), Image.new("RGB", first.size, "black")]
    gif = tmp_path / "moving.gif"
    frames[0].save(gif, save_all=True, append_images=frames[1:], duration=100, loop=0)
    page = page_for(model, gif, tmp_path)
    assert page.text and "3 frames: only its first frame was captioned" in page.note


def test_16bit_png_and_cmyk_jpeg_are_converted_with_a_note(model, trained: Trained, tmp_path: Path) -> None:
    grey = np.asarray(Image.open(trained.images[0]).convert("L"), dtype=np.uint16) * 257  # (H, W) in 0..65535
    deep = tmp_path / "deep.png"
    Image.fromarray(grey).save(deep)  # uint16: mode I;16
    cmyk = tmp_path / "print.jpg"
    Image.open(trained.images[0]).convert("CMYK").save(cmyk, quality=95)
    deep_page, cmyk_page = page_for(model, deep, tmp_path), page_for(model, cmyk, tmp_path)
    assert deep_page.text and "16-bit image" in deep_page.note and "converted to 8-bit RGB" in deep_page.note
    assert cmyk_page.text and "CMYK image: converted to RGB" in cmyk_page.note


def test_layer_and_head_choices_follow_the_decoder(model, trained: Trained, tmp_path: Path) -> None:
    assert attention_choices(model) == (["1"], [MEAN, "1"])  # the LSTM: one map per word
    transformer = load_captioner(trained.transformer)
    assert attention_choices(transformer) == (["1", "2"], [MEAN, "1", "2"])
    # Redraw one caption for several layer/head choices: each choice shows its own maps.
    torch.manual_seed(0)
    attn = torch.rand(3, 2, 2, 4, 4).softmax(-1)  # (T, L, H, h, w)
    caption = Caption("a red star", ["a", "red", "star"], [4, 5, 6], -0.5, -1.5, attn, True)
    result = Result(caption, Image.open(trained.images[0]).convert("RGB"), "tiny transformer", 3, 0.1, [])
    pages = {(layer, head): render_page(result, layer, head, tmp_path) for layer in ("1", "2")
             for head in (MEAN, "1", "2")}
    assert "layer 1, head 2" in pages["1", "2"].score_line and "layer 2, mean of heads" in pages["2", MEAN].score_line
    pixels = {key: np.asarray(page.gallery[0][0]) for key, page in pages.items()}
    assert len({p.tobytes() for p in pixels.values()}) == len(pixels)
    # A choice left over from another model is clamped, never an index error.
    assert "layer 2, mean of heads" in render_page(result, "7", "9", tmp_path).score_line


def test_a_bare_demo_serves_the_trained_quickstart_model_and_never_trains(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With no export and no packaged model, the quickstart's trained run; with none, one line
    saying what to run, even where the shapes config is there to train."""
    from captioner.models import model_paths as packaged

    monkeypatch.setattr(packaged, "PACKAGED_FOLDER", tmp_path / "no_packaged_model")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs/shapes_lstm.yaml").write_text((REPO / "configs/shapes_lstm.yaml").read_text())
    trainings = []
    monkeypatch.setattr("captioner.training.fit.fit",
                        lambda config, resume=False: trainings.append(config.train.out_dir) or Path("trained.pt"))
    with pytest.raises(CheckpointError, match=r"^no default model here: .*`captioner train configs/shapes_lstm.yaml`"):
        default_checkpoint()
    assert trainings == []
    (tmp_path / "runs/shapes_lstm").mkdir(parents=True)
    (tmp_path / "runs/shapes_lstm/last.pt").write_bytes(b"weights")
    assert default_checkpoint() == Path("runs/shapes_lstm/last.pt")
    (tmp_path / "runs/shapes_lstm/best.pt").write_bytes(b"weights")
    assert default_checkpoint() == Path("runs/shapes_lstm/best.pt") and trainings == []


def test_examples_come_from_the_model_dataset_and_are_never_generated(trained: Trained, tmp_path: Path) -> None:
    from captioner.models.checkpoint import checkpoint_config

    examples = dataset_examples(checkpoint_config(trained.checkpoint), count=3)
    assert len(examples) == 3 and all(p.is_file() for p in examples)
    missing = load_config(None, [f"data.root={tmp_path / 'nowhere'}"])
    assert dataset_examples(missing) == [] and not (tmp_path / "nowhere").exists()


def test_a_bug_in_a_callback_gets_a_sentence_and_the_log_gets_the_traceback(
    model, trained: Trained, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    callbacks = Callbacks({str(trained.checkpoint): model})

    def broken(*args, **kwargs):
        raise RuntimeError("an internal bug")

    monkeypatch.setattr("captioner.apps.demo.ui.caption_page", broken)
    with caplog.at_level("ERROR", logger="captioner.apps.demo.ui"):
        text, _, gallery, note, result = callbacks.caption(str(trained.images[0]), str(trained.checkpoint), 3,
                                                           MAX_LENGTH, "1", MEAN)
    assert (text, gallery, result) == ("", [], None)
    assert "Something went wrong on the server" in note and "an internal bug" not in note and "Traceback" not in note
    assert "an internal bug" in caplog.text and "captioning failed" in caplog.text


def test_figure_failure_keeps_the_caption_and_the_download_disabled(
    model, trained: Trained, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    callbacks = Callbacks({str(trained.checkpoint): model})
    text, _, _, _, result = callbacks.caption(str(trained.images[0]), str(trained.checkpoint), 3, MAX_LENGTH, "1", MEAN)
    assert text and result is not None
    assert Path(callbacks.figure(result, "1", MEAN)).is_file()
    monkeypatch.setattr("captioner.apps.demo.ui.write_figure", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with caplog.at_level("ERROR", logger="captioner.apps.demo.ui"):
        assert callbacks.figure(result, "1", MEAN) is None
    assert "drawing the figure failed" in caplog.text
    assert enable_download(None).interactive is False


def test_before_any_caption_a_redraw_or_figure_changes_nothing(model, trained: Trained) -> None:
    import gradio as gr

    callbacks = Callbacks({str(trained.checkpoint): model})
    skipped = callbacks.redraw(None, "1", MEAN)
    assert len(skipped) == 5 and all(value == gr.skip() for value in skipped)
    assert callbacks.figure(None, "1", MEAN) is None


def test_bad_checkpoints_stop_the_demo_before_it_serves(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="missing.pt: checkpoint not found"):
        build_demo([tmp_path / "missing.pt"])
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="garbage.pt") as caught:
        build_demo([tmp_path / "garbage.pt"])
    assert "\n" not in str(caught.value)
    with pytest.raises(CaptionerError, match="no checkpoint to serve"):
        build_demo([])


def test_a_gradio_temp_dir_that_is_a_file_stops_the_demo_in_one_line(model, trained: Trained, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine")
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(blocker))
    with pytest.raises(CaptionerError, match=rf"^demo: GRADIO_TEMP_DIR {blocker}: cannot hold the page's pictures"):
        Callbacks({str(trained.checkpoint): model})
    assert blocker.read_text() == "mine"


def test_port_0_serves_on_the_free_port_the_system_gives() -> None:
    """`--port 0`: Gradio's start-up check cannot reach port 0 (a traceback), so the page is served on the port
    the system gives the check, which is free."""
    port = demo_server.check_port("127.0.0.1", 0)
    assert isinstance(port, int) and 0 < port <= 65535
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))
        with pytest.raises(CaptionerError, match=rf"^demo --port {port}: port {port} on 127\.0\.0\.1 is in use"):
            demo_server.check_port("127.0.0.1", port)


def test_the_served_captions_threads_are_timed_unless_the_user_set_them(model, trained: Trained,
                                                                        monkeypatch) -> None:
    """`captioner demo` times one caption by each model on 1 thread and on the free cores before it serves
    (`threads_that_pay`); $CAPTIONER_THREADS skips it."""
    transformer = load_captioner(trained.transformer)
    asked: list[tuple[str, dict, tuple[int, int]]] = []  # (model, options, picture size) of each caption
    for name, served in (("lstm", model), ("transformer", transformer)):
        caption = served.caption
        monkeypatch.setattr(served, "caption", lambda picture, caption=caption, name=name, **options: (
            asked.append((name, options, picture.size)), caption(picture, **options))[1])
    monkeypatch.setattr(demo_server, "free_cores", lambda: 2)
    monkeypatch.delenv("CAPTIONER_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    before = torch.get_num_threads()
    try:
        threads = demo_server.choose_threads(LocalDecoder([model, transformer]))
        assert threads == torch.get_num_threads() in (1, 2)
        assert len(asked) == 2 * 6  # both models, in a warm-up and two rounds on each count
        assert asked[:2] == [("lstm", {"self_attention": False}, (512, 384)),
                             ("transformer", {"self_attention": True}, (512, 384))]  # as the page asks
        asked.clear()
        monkeypatch.setenv("CAPTIONER_THREADS", "1")
        torch.set_num_threads(1)
        assert demo_server.choose_threads(LocalDecoder([model])) == 1 and asked == []  # the user's count: nothing timed
    finally:
        torch.set_num_threads(before)


def test_close_waits_for_the_captions_in_flight(model, trained: Trained) -> None:
    """What `close` relies on: a tracked callback is waited for, and an idle server is not."""
    callbacks = Callbacks({str(trained.checkpoint): model})
    started, release = threading.Event(), threading.Event()

    def slow(x: int) -> int:
        started.set()
        release.wait(10)
        return x + 1

    tracked = callbacks.tracked(slow)
    worker = threading.Thread(target=tracked, args=(1,))
    worker.start()
    started.wait(10)
    assert callbacks.wait_idle(0.1) is False  # still running
    release.set()
    assert callbacks.wait_idle(10) is True
    worker.join()
    assert tracked(2) == 3 and tracked.__wrapped__ is slow  # Gradio reads the callback's own signature


SHUTDOWN_SCRIPT = """
import sys, time
from pathlib import Path
import torch
import httpx
import torch.nn.functional as F
from captioner.apps.demo import page, server, ui

checkpoint, image, started = sys.argv[1], sys.argv[2], Path(sys.argv[3])

def slow_page(*args, **kwargs):  # a caption that is still inside torch when the server closes
    started.write_text("started")
    x = torch.rand(1, 1, 64, 64)
    until = time.time() + 1.5  # far past the 0.05 s poll below: close() comes while this still runs
    while time.time() < until:
        F.interpolate(x, size=(600, 600), mode="bilinear")
    return page.message("done")

ui.caption_page = slow_page  # what the /caption callback calls
demo = ui.build_demo([Path(checkpoint)], [])
url = server.launch(demo, "127.0.0.1", int(sys.argv[4]), block=False)
# Gradio's plain HTTP API: the caption runs without a client holding a stream open, so `close` waits
# for the caption alone, not 5 s for a connection, and no client thread is left waiting at exit.
with open(image, "rb") as f:
    upload = httpx.post(f"{url}gradio_api/upload", files={"files": f}).json()[0]
inputs = [{"path": upload, "meta": {"_type": "gradio.FileData"}}, checkpoint, 3, 8, None, None]
httpx.post(f"{url}gradio_api/call/caption", json={"data": inputs}).raise_for_status()
while not started.exists():
    time.sleep(0.05)
server.close(demo)
"""


def test_closing_the_server_with_a_caption_in_flight_exits_cleanly(trained: Trained, server: str,
                                                                   tmp_path: Path) -> None:
    """A daemon worker thread still inside torch when the interpreter exits ends the process with
    status 134 ("terminate called without an active exception"); `close` waits for it, so the
    process ends with status 0. And the closing server deletes what it cached in its own
    process's cache, not another server's copy of the same picture (in a shared /tmp/gradio it
    would take this process's upload, and a browser test beside it would lose its picture)."""
    import sys

    import httpx

    with trained.images[0].open("rb") as f:  # the picture the other process's server gets too
        upload = httpx.post(f"{server}gradio_api/upload", files={"files": f}).json()[0]
    args = [sys.executable, "-c", SHUTDOWN_SCRIPT, str(trained.transformer), str(trained.images[0]),
            str(tmp_path / "started"), str(free_port())]
    done = warm_start.run(args, capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
                          env=subprocess_env())  # the warm interpreter's: forked, not cold
    assert (tmp_path / "started").exists(), done.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr
    assert Path(upload).is_file(), f"{upload}: deleted when the other process's server closed"


# --- the server, through its API ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(trained: Trained) -> Iterator[str]:
    demo = build_demo([trained.checkpoint, trained.transformer], trained.images[:3])
    url = launch(demo, "127.0.0.1", free_port(), block=False, max_file_size=2_000_000)
    yield url
    close(demo)


def client(url: str, tmp_path: Path):
    from gradio_client import Client

    return Client(url, verbose=False, analytics_enabled=False, download_files=str(tmp_path))


def test_api_captions_through_the_same_path_as_the_cli(server: str, trained: Trained, model, tmp_path: Path) -> None:
    """Through the server, with options other than the page's defaults: the callback passes them on."""
    from gradio_client import handle_file

    image, beam, length = trained.images[1], 2, 5
    api = client(server, tmp_path)
    text, score, gallery, note = api.predict(
        handle_file(str(image)), model_name=str(trained.checkpoint), beam_size=beam, max_length=length,
        api_name="/caption"
    )
    [expected] = model.caption([image], beam_size=beam, max_length=length)  # what `captioner caption` prints
    assert text == expected.text and score.startswith(f"score {expected.score:.3f}") and f"· beam {beam} ·" in score
    assert [item["caption"] for item in gallery] == expected.words
    assert all(Image.open(item["image"]).size == Image.open(image).size for item in gallery)
    assert note == ("" if expected.finished
                    else f"The caption reached the maximum length ({length} words) before the model ended it.")
    figure = api.predict(api_name="/figure")  # of this session's caption
    assert Image.open(figure).format == "JPEG" and count_panels(figure) == 1 + len(expected.words)


def test_the_queue_sums_up_no_events_for_a_dashboard_the_page_never_turns_on(server: str, trained: Trained,
                                                                           tmp_path: Path) -> None:
    """Gradio's queue would keep up to 10,000 events and sum them up in a DataFrame after each one, for its
    monitoring dashboard: this page's queue keeps one and never sums (`ui.skip_event_analytics`)."""
    from gradio_client import handle_file

    from captioner.apps.demo import ui

    [demo] = [page for page in list(ui._CALLBACKS) if getattr(page, "local_url", None) == server]
    api = client(server, tmp_path)
    for image in trained.images[:2]:
        api.predict(handle_file(str(image)), model_name=str(trained.checkpoint), api_name="/caption")
        api.predict(api_name="/figure")
    queue = demo._queue
    assert queue.events_recorded >= 4 and len(queue.event_analytics) == 1
    assert queue.cached_event_analytics_summary == {"functions": {}}


def test_the_load_benchmark_asks_for_the_views_as_the_page_does(server: str, trained: Trained) -> None:
    """benchmarks demo_load calls the page's private views step by index, as a browser does (gradio_client refuses
    it by name), and gets both pictures of a transformer's caption."""
    import httpx
    from gradio_client import Client, handle_file

    from benchmarks.bench_demo_load import views_drawn, views_step

    api = Client(server, verbose=False, analytics_enabled=False, download_files=False)  # URLs, as the benchmark
    step = views_step(api)
    visibility = {d.get("id", i): d.get("api_visibility") for i, d in enumerate(api.config["dependencies"])}
    assert step is not None and visibility[step[0]] == "private"
    api.predict(handle_file(str(trained.images[0])), model_name=str(trained.transformer), api_name="/caption")
    with httpx.Client(timeout=60) as session:
        assert views_drawn(api, step, session)


def test_api_bad_upload_gets_the_message_not_a_traceback(server: str, tmp_path: Path) -> None:
    from gradio_client import handle_file

    bad = tmp_path / "report.pdf"
    bad.write_bytes(b"%PDF-1.4 not an image at all")
    text, _, gallery, note = client(server, tmp_path).predict(handle_file(str(bad)), api_name="/caption")
    assert (text, gallery) == ("", [])
    assert "report.pdf: not an image file" in note and "Traceback" not in note


def test_server_refuses_uploads_over_the_size_limit(server: str) -> None:
    import httpx

    big = {"files": ("big.png", os.urandom(2_100_000), "image/png")}
    response = httpx.post(f"{server}gradio_api/upload", files=big, timeout=30)
    assert response.status_code == 413


def test_api_concurrent_requests_all_get_the_right_caption(server: str, trained: Trained, model,
                                                           tmp_path: Path) -> None:
    from gradio_client import handle_file

    image = trained.images[2]
    expected = model.caption(load_image(image), beam_size=3, max_length=MAX_LENGTH).text
    answers: list[str] = []

    def ask(i: int) -> None:
        answers.append(client(server, tmp_path / str(i)).predict(handle_file(str(image)), api_name="/caption")[0])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert answers == [expected] * 4


# --- a real browser ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(chromium: Path):
    with chromium_browser(chromium) as browser:
        yield browser


def thumbnail_pixels(page) -> np.ndarray:
    """The first heatmap the page shows, as pixels (H, W, 3): its file name is new on every
    redraw, so only the pixels tell whether the map changed."""
    src = page.get_attribute("#heatmaps .thumbnail-item img", "src")
    return np.asarray(Image.open(io.BytesIO(page.request.get(src).body())).convert("RGB"), dtype=np.int16)


def screenshot_path(tmp_path: Path) -> Path:
    """docs/demo.png only when CAPTIONER_SCREENSHOT asks (1, or a path): tests never write into
    the repository by default."""
    wanted = os.environ.get("CAPTIONER_SCREENSHOT", "")
    if wanted in ("", "0"):
        return tmp_path / "demo.png"
    return REPO / "docs" / "demo.png" if wanted == "1" else Path(wanted)


@pytest.fixture(scope="module")
def browser_server(trained: Trained) -> Iterator[tuple[str, Path, Path]]:
    """The LSTM and the transformer; CAPTIONER_DEMO_CHECKPOINT shows a real model instead of the
    tiny one (for the README's screenshot)."""
    checkpoint = Path(os.environ.get("CAPTIONER_DEMO_CHECKPOINT") or trained.checkpoint)
    image = Path(os.environ.get("CAPTIONER_DEMO_IMAGE") or trained.images[1])
    demo = build_demo([checkpoint, trained.transformer], [*trained.images[:4]])
    url = launch(demo, "127.0.0.1", free_port(), block=False)
    yield url, checkpoint, image
    close(demo)


def test_browser_upload_caption_and_heatmaps(browser, browser_server, tmp_path: Path) -> None:
    url, checkpoint, image = browser_server
    # the config's beam and length: the page's defaults
    expected = load_captioner(checkpoint).caption(load_image(image))
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    outside: list[str] = []
    page.on("request", lambda r: outside.append(r.url) if not r.url.startswith((url, "data:", "blob:")) else None)
    page.goto(url)
    page.wait_for_selector("#run")
    assert not page.is_visible("#layer")  # the LSTM has one map per word: no layer/head choice

    page.set_input_files("#image input[type=file]", str(image))
    page.wait_for_selector(f"#image img[src$='{image.name}']")  # uploaded
    page.click("#run")
    page.wait_for_function("document.querySelector('#caption textarea').value.length > 0", timeout=60_000)
    assert page.input_value("#caption textarea") == expected.text
    thumbnails = page.locator("#heatmaps .thumbnail-item img")
    thumbnails.nth(len(expected.words) - 1).wait_for()
    assert [thumbnails.nth(i).get_attribute("alt") for i in range(thumbnails.count())] == expected.words
    first, second = (page.request.get(thumbnails.nth(i).get_attribute("src")).body() for i in (0, 1))
    first_pixels, second_pixels = (np.asarray(Image.open(io.BytesIO(b)).convert("RGB"), dtype=np.int16)
                                   for b in (first, second))
    assert first_pixels.shape == second_pixels.shape and np.abs(first_pixels - second_pixels).mean() > 0.5
    assert "score" in page.inner_text("#score")
    page.wait_for_selector("#download:not([disabled])", timeout=60_000)  # the figure comes a moment after the caption
    with page.expect_download() as download:
        page.click("#download")
    figure = download.value.path()
    assert Image.open(figure).format == "JPEG" and count_panels(figure) == 1 + len(expected.words)
    page.screenshot(path=str(screenshot_path(tmp_path)), full_page=True)

    bad = tmp_path / "notes.png"
    bad.write_text("not a picture")
    page.set_input_files("#image input[type=file]", str(bad))
    page.wait_for_selector("#image img[src$='notes.png']")  # uploaded
    page.click("#run")
    page.wait_for_function("document.querySelector('#note').innerText.includes('Could not caption')", timeout=60_000)
    assert "notes.png: not an image file" in page.inner_text("#note") and "Traceback" not in page.content()

    page.click("#model input")  # the transformer: its layers and heads become choices
    page.get_by_role("option", name="transformer.pt", exact=False).click()
    page.wait_for_selector("#layer", state="visible")
    page.set_input_files("#image input[type=file]", str(image))
    page.wait_for_selector(f"#image img[src$='{image.name}']")
    page.click("#run")
    page.wait_for_function("document.querySelector('#score').innerText.includes('layer 2, mean of heads')",
                           timeout=60_000)
    mean_of_heads = thumbnail_pixels(page)
    page.click("#head input")  # a head of its own: the maps are redrawn without decoding again
    page.get_by_role("option", name="1", exact=True).click()
    page.wait_for_function("document.querySelector('#score').innerText.includes('layer 2, head 1')", timeout=60_000)
    head_one = thumbnail_pixels(page)
    # other maps, not only other files
    assert mean_of_heads.shape == head_one.shape and np.abs(mean_of_heads - head_one).mean() > 0.5
    page.wait_for_selector("#download:not([disabled])", timeout=60_000)  # the redraw's figure is done too
    page.close()  # its open connections would hold up the server's shutdown
    assert outside == []  # the page works offline: nothing fetched from anywhere but the demo
