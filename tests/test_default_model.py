"""The default model: an export at runs/default_model is what `captioner demo`, `captioner caption`
without a model and `captioner.default_model()` use; without it and without a model packaged with
captioner, the quickstart's shapes run; a broken one is one line naming its file, never a silent
fallback. The demo says which model serves and its test scores. (The packaged model's place in
this order: tests/test_packaged_model.py.)

Each test runs in a temporary project folder (chdir) with tiny untrained models, and with no
packaged model installed (the package's folder pointed at an empty one): the export has
hidden_dim 20 and the shapes run 24, so a loaded model tells which one was chosen.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import require_module, tiny_config, tiny_model
from PIL import Image

from captioner.apps.cli import main
from captioner.apps.commands.caption import model_and_images
from captioner.core.config import load_config
from captioner.core.errors import CaptionerError, CheckpointError, ExportError
from captioner.models.checkpoint import default_model, save_checkpoint
from captioner.models.model_paths import DEFAULT_MODEL, QUICKSTART_RUN
from captioner.models.export_format import CONFIG, WEIGHTS

REPO = Path(__file__).resolve().parents[1]
EXPORT_HIDDEN, SHAPES_HIDDEN = 20, 24
TEST_SCORES = {"overall": {"Bleu_1": 0.6, "Bleu_4": 0.2341, "METEOR": 0.1876, "CIDEr": 0.5432}, "images": 1000,
               "beam_size": 3,
               "metrics": "official COCO caption metrics"}
VALIDATION = {"Bleu_4": 0.2109, "CIDEr": 0.4567}


def write_export(folder: Path, test: dict | None = None) -> None:
    """A tiny export as `captioner export` lays it out, with the scores it records."""
    torch.manual_seed(1)
    model = tiny_model(f"model.decoder.hidden_dim={EXPORT_HIDDEN}", "decode.max_length=4")
    config = tiny_config(f"model.decoder.hidden_dim={EXPORT_HIDDEN}", "data.dataset=flickr8k",
                         "train.out_dir=runs/flickr8k_full")
    scores = {"validation": VALIDATION, "validation_epoch": 4, "test": {"test": test} if test else {}}
    model.save_pretrained(folder, training_config=config.to_dict(), scores=scores)


@pytest.fixture(autouse=True)
def no_packaged_model(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests hold with or without a model packaged in this checkout: they see none."""
    from captioner.models import model_paths as packaged

    monkeypatch.setattr(packaged, "PACKAGED_FOLDER", tmp_path_factory.mktemp("no_packaged_model"))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder, the working folder of the test: configs/shapes_lstm.yaml, a trained
    (tiny) runs/shapes_lstm and one image; no runs/default_model yet."""
    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs/shapes_lstm.yaml").write_text((REPO / "configs/shapes_lstm.yaml").read_text())
    save_checkpoint(tmp_path / QUICKSTART_RUN / "best.pt",
                    tiny_model(f"model.decoder.hidden_dim={SHAPES_HIDDEN}", "decode.max_length=4"))
    Image.fromarray(np.full((24, 20, 3), 120, dtype=np.uint8)).save(tmp_path / "photo.png")
    return tmp_path


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the CLI loads its model from, in order."""
    from captioner.models import checkpoint

    paths: list[str] = []
    original = checkpoint.load_captioner
    monkeypatch.setattr(checkpoint, "load_captioner",
                        lambda path, device="auto": paths.append(str(path)) or original(path, device))
    return paths


def test_the_quickstart_run_is_where_the_shapes_config_trains() -> None:
    """The library's fallback and the demo's (which trains configs/shapes_lstm.yaml when missing) are one folder."""
    assert Path(load_config(REPO / "configs/shapes_lstm.yaml").train.out_dir) == QUICKSTART_RUN
    assert DEFAULT_MODEL == Path("runs/default_model")


def test_an_export_at_runs_default_model_is_the_default(
    project: Path, loaded: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    write_export(project / DEFAULT_MODEL)
    with caplog.at_level(logging.INFO):
        assert default_model(device="cpu").config.decoder.hidden_dim == EXPORT_HIDDEN
    assert "default model: the export at runs/default_model" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert main(["caption", "photo.png", "--device", "cpu"]) == 0
    assert loaded == [str(DEFAULT_MODEL)]
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("default model")] == [
        "default model: the export at runs/default_model"
    ]  # one line
    by_default = capsys.readouterr().out
    assert main(["caption", str(DEFAULT_MODEL), "photo.png", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == by_default and by_default.startswith("photo.png\t")


def test_without_an_export_the_default_is_the_shapes_run(
    project: Path, loaded: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        assert default_model(device="cpu").config.decoder.hidden_dim == SHAPES_HIDDEN
    assert ("default model: the shapes run runs/shapes_lstm (no export at runs/default_model, no packaged "
            "model)") in caplog.text
    assert main(["caption", "photo.png", "--device", "cpu"]) == 0
    assert loaded == [str(QUICKSTART_RUN)] and capsys.readouterr().out.startswith("photo.png\t")


def test_with_neither_the_error_says_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as caught:
        default_model(device="cpu")
    message = str(caught.value)
    assert "\n" not in message
    assert ("captioner export runs/<best run> runs/default_model" in message
            and "captioner train configs/shapes_lstm.yaml" in message)
    assert main(["caption", "photo.jpg"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"


def truncate_weights(folder: Path) -> None:
    data = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(data[: len(data) // 2])


BROKEN = {  # how the default model's folder is broken -> the file the error names
    "an empty folder": (lambda folder: folder.mkdir(parents=True), CONFIG),
    "an export cut short": (lambda folder: (write_export(folder), (folder / CONFIG).unlink()), CONFIG),
    "config.json not JSON": (lambda folder: (write_export(folder), (folder / CONFIG).write_text("{ not json")), CONFIG),
    "truncated weights": (lambda folder: (write_export(folder), truncate_weights(folder)), WEIGHTS),
    "a file, not a folder": (lambda folder: folder.write_text("x"), ""),
}


@pytest.mark.parametrize("fault", BROKEN)
def test_a_broken_default_model_is_one_line_naming_its_file_not_a_fallback(
    project: Path, fault: str, loaded: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """runs/shapes_lstm is there, but a runs/default_model that is there and broken is an error:
    serving the shapes model on photographs instead would look like a broken model."""
    make, file = BROKEN[fault]
    make(project / DEFAULT_MODEL)
    named = str(DEFAULT_MODEL / file) if file else str(DEFAULT_MODEL)
    with pytest.raises(ExportError) as caught:
        default_model(device="cpu")
    assert "\n" not in str(caught.value) and str(caught.value).startswith(named + ":"), caught.value
    assert main(["caption", "photo.png", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {named}:") and err.count("\n") == 1
    assert str(QUICKSTART_RUN) not in loaded


def test_caption_takes_a_model_first_unless_the_first_argument_is_an_image(project: Path) -> None:
    folder = project / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"")
    assert model_and_images(["runs/shapes_lstm/best.pt", "photo.png", "photos"]) == ("runs/shapes_lstm/best.pt",
                                                                                     ["photo.png", "photos"])
    # by extension, found or not
    assert model_and_images(["photo.png", "missing.JPG"]) == (str(QUICKSTART_RUN), ["photo.png", "missing.JPG"])
    # a folder of images
    assert model_and_images(["photos", "photo.png"]) == (str(QUICKSTART_RUN), ["photos", "photo.png"])
    (project / QUICKSTART_RUN / "heatmap.jpg").write_bytes(b"")
    # a run folder is a model, images or not
    assert model_and_images(["runs/shapes_lstm", "photo.png"]) == ("runs/shapes_lstm", ["photo.png"])
    assert model_and_images(["someone/flickr8k-lstm", "photo.png"])[0] == "someone/flickr8k-lstm"  # a Hub id
    with pytest.raises(CaptionerError, match=r"^caption: no images given after the model runs/shapes_lstm/best.pt"):
        model_and_images(["runs/shapes_lstm/best.pt"])
    with pytest.raises(CaptionerError, match=r"^caption --runtime onnx: name the exported folder"):
        model_and_images(["photo.png"], runtime="onnx")


# --- the demo -----------------------------------------------------------------------------------


@pytest.fixture
def demo_server():
    require_module("gradio", "the demo extra is not installed (pip install -e .[demo])")
    from captioner.apps.demo import server

    return server


def test_the_demo_serves_the_export_else_the_shapes_run_and_refuses_a_broken_one(
    project: Path, demo_server, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        assert demo_server.default_checkpoint() == QUICKSTART_RUN / "best.pt"
    assert ("default model: the shapes run runs/shapes_lstm (no export at runs/default_model, no packaged "
            "model)") in caplog.text
    (project / DEFAULT_MODEL).mkdir(parents=True)
    with pytest.raises(ExportError, match=r"^runs/default_model/config.json: missing"):
        demo_server.default_checkpoint()
    write_export(project / DEFAULT_MODEL)
    (project / "configs/shapes_lstm.yaml").unlink()  # an export needs no shapes config
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert demo_server.default_checkpoint() == DEFAULT_MODEL
    assert "default model: the export at runs/default_model" in caplog.text


def serving_text(demo) -> str:
    (line,) = [block.value for block in demo.blocks.values() if getattr(block, "elem_id", None) == "serving"]
    return line


def test_the_page_says_which_model_serves_with_its_test_scores(project: Path, demo_server) -> None:
    from captioner.apps.demo.ui import _CALLBACKS, build_demo

    write_export(project / DEFAULT_MODEL, TEST_SCORES)
    demo = build_demo([demo_server.default_checkpoint()], examples=[])
    line = serving_text(demo)
    assert line == ("**Serving:** runs/default_model (lstm over small_cnn), exported from flickr8k_full — Flickr8k, "
                    "test BLEU-4 0.234, METEOR 0.188, CIDEr-D 0.543 (beam 3)")
    ids = [block._id for block in demo.blocks.values()
           if getattr(block, "elem_id", None) in ("serving", "image", "model_card")]
    assert ids == sorted(ids)  # above the image and the controls, not among the cards below
    # Another model chosen in the menu: its own line (a checkpoint's test scores come from scores_test.json beside it).
    (project / QUICKSTART_RUN / "scores_test.json").write_text(
        json.dumps({**TEST_SCORES, "overall": {"Bleu_4": 0.9, "CIDEr": 5.5}}))
    demo = build_demo([DEFAULT_MODEL, QUICKSTART_RUN / "best.pt"], examples=[])
    assert serving_text(demo).startswith("**Serving:** runs/default_model")
    *_, shapes_line = _CALLBACKS[demo].choose_model(str(QUICKSTART_RUN / "best.pt"))
    assert shapes_line == ("**Serving:** shapes_lstm/best.pt (lstm over small_cnn) — the shapes world, test BLEU-4 "
                           "0.900, CIDEr-D 5.500 (beam 3)")


def test_without_test_scores_the_page_gives_validation_marked_as_such(project: Path, demo_server) -> None:
    from captioner.apps.demo.ui import build_demo

    write_export(project / DEFAULT_MODEL)
    line = serving_text(build_demo([DEFAULT_MODEL], examples=[]))
    assert line.endswith(
        "— Flickr8k, validation BLEU-4 0.211, CIDEr-D 0.457 (epoch 4, beam 1; no test scores recorded)"), line
