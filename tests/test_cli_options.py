"""CLI options that must not override the checkpoint's config, or write beside their inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, tiny_model

SHAPES_LSTM = str(REPO / "configs/shapes_lstm.yaml")
from PIL import Image

from captioner.apps.cli import main
from captioner.models.captioner import Captioner
from captioner.models.checkpoint import save_checkpoint


@pytest.fixture
def checkpoint_and_images(tmp_path: Path) -> tuple[Path, list[Path]]:
    torch.set_num_threads(1)
    checkpoint = tmp_path / "model.pt"
    save_checkpoint(checkpoint, tiny_model("decode.batch_size=3", "decode.max_length=4"))
    images = []
    for i in range(5):
        images.append(tmp_path / f"image{i}.png")
        Image.fromarray(np.full((20, 24, 3), 40 * i, dtype=np.uint8)).save(images[-1])
    return checkpoint, images


@pytest.mark.parametrize(("flag", "batches"), [([], [3, 2]), (["--batch-size", "2"], [2, 2, 1])])
def test_caption_batch_size_defaults_to_the_checkpoint_config(
    checkpoint_and_images, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: list[str],
    batches: list[int]
) -> None:
    checkpoint, images = checkpoint_and_images
    seen: list[int] = []
    original = Captioner._caption_batch
    monkeypatch.setattr(Captioner, "_caption_batch", lambda self, x, *a: seen.append(len(x)) or original(self, x, *a))
    assert main(["caption", str(checkpoint), *map(str, images), "--device", "cpu", *flag]) == 0
    assert seen == batches  # decode.batch_size=3 from the checkpoint unless the flag says otherwise
    assert len(capsys.readouterr().out.splitlines()) == len(images)


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_decode_flags_refuse_non_positive_values(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["caption", "model.pt", "x.jpg", "--batch-size", value])
    assert info.value.code == 2 and "--batch-size" in capsys.readouterr().err


def test_evaluate_results_writes_scores_to_runs_eval_and_replaces_no_file_but_scores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    annotations = data / "captions.json"
    annotations.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}],
        "annotations": [{"image_id": 1, "caption": "a red circle"}, {"image_id": 2, "caption": "a blue square"}],
    }))
    results = data / "mine.json"
    results.write_text(
        json.dumps([{"image_id": 1, "caption": "a red circle"}, {"image_id": 2, "caption": "a blue circle"}]))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = sorted(data.iterdir())
    assert main(["evaluate", "--fast", "--results", str(results), "--annotations", str(annotations)]) == 0
    assert sorted(data.iterdir()) == before  # nothing written into the data folder
    scores = work / "runs" / "eval" / "mine_scores.json"
    assert json.loads(scores.read_text())["overall"]["Bleu_1"] > 0.5
    assert f"scores: {Path('runs/eval/mine_scores.json')}" in capsys.readouterr().out
    # --out as a folder or a file
    assert main(
        ["evaluate", "--fast", "--results", str(results), "--annotations", str(annotations), "--out", "elsewhere"]) == 0
    assert (work / "elsewhere" / "scores.json").is_file()
    assert main(
        ["evaluate", "--fast", "--results", str(results), "--annotations", str(annotations), "--out", "s.json"]) == 0
    assert (work / "s.json").is_file() and sorted(data.iterdir()) == before
    (work / "folder.json").mkdir()  # a folder whose name ends in .json is a folder: was "a file that is not ..."
    assert main(["evaluate", "--fast", "--results", str(results), "--annotations", str(annotations), "--out",
                 "folder.json"]) == 0
    assert (work / "folder.json" / "scores.json").is_file()
    # an earlier scores file is replaced; the inputs and any other file are kept, the refusal one line
    assert main(
        ["evaluate", "--fast", "--results", str(results), "--annotations", str(annotations), "--out", "s.json"]) == 0
    capsys.readouterr()
    (work / "mine.json").write_text('{"my": "data"}')
    (work / "notes.txt").write_text("mine")
    inputs = {path: path.read_bytes() for path in (results, annotations, work / "mine.json", work / "notes.txt")}
    for out, said in ((results, "that is the --results file"), (annotations, "that is the --annotations file"),
                      ("mine.json", "a file that is not a scores file; it is kept"),
                      ("notes.txt", "a file, not a folder (nor a .json file for the scores)")):
        argv = ["evaluate", "--fast", "--results", str(results), "--annotations", str(annotations), "--out", str(out)]
        assert main(argv) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith(f"error: evaluate --out {out}") and said in line, line
    assert {path: path.read_bytes() for path in inputs} == inputs


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    import captioner

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"captioner {captioner.__version__}"


def test_every_argument_of_every_command_has_help_and_shows_its_default() -> None:
    import argparse

    from captioner.apps.cli import build_parser

    missing, helps = [], {}

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        helps[path] = parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)) and not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(), "captioner")
    assert missing == []
    flat = {path: " ".join(text.split()) for path, text in helps.items()}  # argparse wraps lines
    assert "the split of the checkpoint's data to caption and score (default: test)" in flat["captioner evaluate"]
    assert "training images (default: 4000)" in flat["captioner data shapes"]
    assert "(default: 7860)" in flat["captioner demo"]
    assert "(default: None)" not in " ".join(flat.values()) and "(default: False)" not in " ".join(flat.values())


def test_train_and_features_name_the_device_with_device_as_every_command_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import argparse

    monkeypatch.chdir(tmp_path)  # train makes its run folder (runs/shapes_lstm) before the run

    import captioner.apps.commands.train as train
    from captioner.apps.commands.train import resume_command

    seen = {}
    monkeypatch.setattr(train, "train_run",
                        lambda config, resume: seen.setdefault("device", config.train.device) and "best.pt")
    assert main(["train", SHAPES_LSTM, "--device", "cpu", "train.epochs=1"]) == 0
    assert seen["device"] == "cpu"
    assert main(["train", SHAPES_LSTM, "--device", "gpu"]) == 2  # checked as train.device is
    assert "train.device" in capsys.readouterr().err
    args = argparse.Namespace(config="c.yaml", overrides=["train.epochs=1"], init=None, device="cuda:1")
    assert resume_command(args) == "captioner train c.yaml train.epochs=1 --device cuda:1 --resume"
    assert main(["features", SHAPES_LSTM, "--device", "tpu"]) == 2
    assert "train.device" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "said"), [
    ("meta", "'meta' is not a device captioner runs on (auto, cpu, mps, cuda or cuda:N)"),
    ("xpu", "'xpu' is not a device captioner runs on"),
    ("mps", "'mps' asked for, but this machine has no Apple GPU (use auto or cpu)"),
    ("cuda", "'cuda' asked for, but no CUDA GPU is available (use auto or cpu)"),
    ("cuda:2", "'cuda:2' asked for, but this machine has 2 CUDA GPU(s): cuda:0 to cuda:1"),
])
def test_a_device_this_machine_lacks_is_one_line(monkeypatch: pytest.MonkeyPatch, name: str, said: str) -> None:
    """Every device torch names but captioner does not run on, or one not present, is refused before any work:
    torch would fail later with a traceback, or put the model on the meta device."""
    from captioner.core.errors import ConfigError
    from captioner.core.process_settings import resolve_device

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: name == "cuda:2")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError) as refused:
        resolve_device(name, "--device")
    assert str(refused.value).startswith(f"--device: {said}")
    assert resolve_device("cpu", "--device") == torch.device("cpu")


def test_figures_of_images_with_one_name_do_not_overwrite_each_other(
    checkpoint_and_images: tuple[Path, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """a/x.png and b/x.png drew one figure, x_attention.png, the second over the first; now each has its own,
    numbered in the order given, and the JSON says which is whose."""
    checkpoint, images = checkpoint_and_images
    same = [tmp_path / folder / "x.png" for folder in ("a", "b")]
    for source, path in zip(images, same):
        path.parent.mkdir()
        path.write_bytes(source.read_bytes())
    out = tmp_path / "figures"
    assert main(["caption", str(checkpoint), *map(str, same), str(images[2]), "--heatmaps", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert [Path(row["heatmaps"]).name for row in rows] == ["x-1_attention.png", "x-2_attention.png",
                                                           "image2_attention.png"]
    assert sorted(p.name for p in out.iterdir()) == sorted(Path(row["heatmaps"]).name for row in rows)
    assert "note: 2 images are named x: their figures are x-1 to x-2, in the order given" in captured.err


def test_a_newline_or_tab_in_an_image_name_keeps_its_text_output_one_line(
    checkpoint_and_images: tuple[Path, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The text output is a path, a tab, a caption a line; a name holding a newline or a tab broke it in two."""
    checkpoint, images = checkpoint_and_images
    odd = tmp_path / "two\nlines\tand a tab.png"
    odd.write_bytes(images[0].read_bytes())
    assert main(["caption", str(checkpoint), str(odd), str(images[1])]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].split("\t")[0] == str(odd).replace("\n", "\\n").replace("\t", "\\t")
    assert all(len(line.split("\t")) == 2 for line in lines)


def test_ensemble_may_come_before_the_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = tmp_path / "a.pt", tmp_path / "b.pt"
    save_checkpoint(first, tiny_model(seed=1))
    save_checkpoint(second, tiny_model(seed=2))
    image = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(image)
    assert main(["caption", str(first), str(image), "--ensemble", str(second), "--device", "cpu"]) == 0
    after = capsys.readouterr().out
    assert main(["caption", str(first), "--ensemble", str(second), str(image), "--device", "cpu"]) == 0
    assert capsys.readouterr().out == after and str(image) in after
