"""End to end through the CLI: generate shapes, train briefly, caption with heatmaps, evaluate, resume.

The LSTM is trained once per session (conftest.py `shapes_lstm`) and shared with the demo tests;
a tiny transformer is trained here for the other decoder. The LSTM's tests check what a constant
or blind caption could not pass: captions that differ between images and name the colours of the
objects there far above chance, and attention that lands on the named objects more than a
uniform map would; a blind model, trained the same way, fails that check.
"""

from __future__ import annotations

import csv
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import REPO, SHAPES_TINY, TrainedRun
from helpers import count_panels

from captioner.apps.cli import main
from captioner.data.shapes import COLOURS
from captioner.evaluation.significance import per_image_scores
from captioner.models.checkpoint import load_captioner

pytestmark = pytest.mark.slow


def objects_of(shapes: Path, split: str) -> dict[str, set[tuple[str, str]]]:
    """image file name -> the (colour, shape) pairs of its objects, from the instances file."""
    data = json.loads((shapes / f"instances_{split}.json").read_text())
    categories = {c["id"]: c["name"] for c in data["categories"]}
    names = {image["id"]: Path(image["file_name"]).name for image in data["images"]}
    objects: dict[str, set[tuple[str, str]]] = {name: set() for name in names.values()}
    for a in data["annotations"]:
        objects[names[a["image_id"]]].add((a["colour"], categories[a["category_id"]]))
    return objects


@dataclass
class Naming:
    """How well captions name what is in their images: of the colour words they write, the
    share that is the colour of an object in that image, beside the share a caption that ignored
    the image would get (each colour word drawn at random: the image's colours / all colours)."""

    images: int
    distinct: int  # distinct captions
    colour_words: int
    precision: float
    chance: float


def naming(checkpoint: Path, shapes: Path, capsys: pytest.CaptureFixture) -> Naming:
    """Caption the val and test images through the CLI (36 images: enough colour words for a
    stable share) and compare each caption's colour words with its image's objects."""
    objects = {**objects_of(shapes, "val"), **objects_of(shapes, "test")}
    images = sorted((shapes / "val").iterdir()) + sorted((shapes / "test").iterdir())
    rows = caption_json(checkpoint, images, capsys, "--beam", "3")
    right = chance = 0.0
    words = 0
    for row in rows:
        colours = {colour for colour, _ in objects[Path(row["image"]).name]}
        named = [w for w in row["caption"].split() if w in COLOURS]
        words += len(named)
        right += sum(w in colours for w in named)
        chance += len(named) * len(colours) / len(COLOURS)
    return Naming(len(rows), len({r["caption"] for r in rows}), words, right / max(words, 1), chance / max(words, 1))


def check_names_the_objects(result: Naming) -> None:
    """Not one caption for every image, and the colours it names are those of the image's objects
    far more often than chance. (Shapes, too, with more training: these seconds-long models
    learn colours first and still name shapes at about chance.)"""
    assert result.distinct >= result.images // 3, result  # a constant caption: 1
    assert result.colour_words >= result.images // 2, result
    assert result.precision >= 0.6 and result.precision >= 1.5 * result.chance, result


def caption_json(checkpoint: Path, images: list[Path], capsys: pytest.CaptureFixture, *extra: str) -> list[dict]:
    capsys.readouterr()  # what earlier commands printed
    assert main(["caption", str(checkpoint), *map(str, images), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


# --- the LSTM --------------------------------------------------------------------------------------


def test_training_writes_checkpoints_logs_and_curves(shapes_lstm: TrainedRun) -> None:
    run = shapes_lstm.run
    for name in ("best.pt", "last.pt", "metrics.csv", "training_curves.png", "config.yaml", "vocab.json"):
        assert (run / name).is_file(), name
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [int(r["epoch"]) for r in rows] == list(range(1, 9))
    finished = json.loads((run / "finished.json").read_text())  # its training ended as the config says
    assert finished["epoch"] == 8 and finished["step"] == int(rows[-1]["step"]), finished
    assert float(rows[-1]["train_loss"]) < 0.7 * float(rows[0]["train_loss"])  # it learns
    assert float(rows[-1]["val_Bleu_1"]) > 0.4  # its own greedy captions (untrained: < 0.15) match the references
    assert list((run / "tensorboard").iterdir())


def test_captions_differ_and_name_the_objects_in_each_image(shapes_lstm: TrainedRun,
                                                            capsys: pytest.CaptureFixture) -> None:
    result = naming(shapes_lstm.checkpoint, shapes_lstm.shapes, capsys)
    check_names_the_objects(result)


def test_caption_with_heatmaps(shapes_lstm: TrainedRun, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    images = shapes_lstm.test_images[:3]
    rows = caption_json(shapes_lstm.checkpoint, images, capsys, "--beam", "3", "--heatmaps", str(tmp_path))
    assert [Path(r["image"]).name for r in rows] == [p.name for p in images]
    vocab = set(load_captioner(shapes_lstm.checkpoint).vocab.words)
    for row in rows:
        words = row["caption"].split()
        assert words and set(words) <= vocab
        assert count_panels(row["heatmaps"]) == 1 + len(words)  # the input, then a panel per word


def test_caption_reports_bad_files_and_goes_on(shapes_lstm: TrainedRun, tmp_path: Path,
                                               capsys: pytest.CaptureFixture) -> None:
    good = shapes_lstm.test_images[0]
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff not really a jpeg")
    code = main(["caption", str(shapes_lstm.checkpoint), str(bad), str(good), str(tmp_path / "missing.png")])
    captured = capsys.readouterr()
    assert code == 1
    assert f"{good}\t" in captured.out
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and "broken.jpg" in errors[0] and "missing.png: no such file" in errors[1]
    assert "Traceback" not in captured.err


def test_evaluate_fast_writes_coco_results(shapes_lstm: TrainedRun, tmp_path: Path,
                                           capsys: pytest.CaptureFixture) -> None:
    args = ["evaluate", str(shapes_lstm.checkpoint), "--split", "test", "--beam", "3", "--fast", "--json", "--out",
            str(tmp_path)]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == 12 and set(report["scores"]) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr"}
    results = json.loads((tmp_path / "results_test.json").read_text())
    assert len(results) == 12 and set(results[0]) == {"image_id", "caption"}
    assert len({r["caption"] for r in results}) >= 6  # not one caption for every image


def test_evaluate_limit(shapes_lstm: TrainedRun, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["evaluate", str(shapes_lstm.checkpoint), "--split", "test", "--fast", "--json", "--limit", "5", "--out",
            str(tmp_path)]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    results = json.loads((tmp_path / "results_test.json").read_text())
    first_five = json.loads((shapes_lstm.shapes / "captions_test.json").read_text())["images"][:5]
    assert report["images"] == 5 and sorted(r["image_id"] for r in results) == sorted(i["id"] for i in first_five)


def test_evaluate_a_run_folder_scores_its_best_checkpoint(shapes_lstm: TrainedRun, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    """A run folder stands for its best.pt, as in Captioner.from_pretrained; with no --out the
    results go beside that checkpoint (a copy of the run here, so the shared run stays as it is:
    a copy is not where its run wrote it, so its dataset outside the working folder is named)."""
    import shutil

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(shapes_lstm.checkpoint, run / "best.pt")
    assert main(["evaluate", str(run), f"data.root={shapes_lstm.shapes}", "--split", "test", "--fast", "--json",
                 "--limit", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["checkpoint"] == str(run / "best.pt") and report["images"] == 3
    assert (run / "results_test.json").is_file() and not (tmp_path / "results_test.json").exists()


def evaluate_with_grounding(checkpoint: Path, out: Path, capsys: pytest.CaptureFixture, *extra: str) -> dict:
    capsys.readouterr()
    args = ["evaluate", str(checkpoint), "--split", "test", "--grounding", "--json", "--out", str(out), *extra]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_evaluate_official_with_grounding(shapes_lstm: TrainedRun, java: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture) -> None:
    report = evaluate_with_grounding(shapes_lstm.checkpoint, tmp_path, capsys, "--heatmaps", str(tmp_path / "figures"))
    figures = sorted((tmp_path / "figures").glob("*_grounding.png"))
    assert len(figures) == 8
    assert all(count_panels(f) >= 2 for f in figures)  # the input and at least one word
    assert set(report["scores"]) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr"}
    grounding = report["grounding"]
    assert grounding["words"] > 0 and 0 < grounding["uniform_baseline"] < 0.5
    # Trained attention lands on the named objects more than a uniform map would. The margin of
    # this seconds-long model is small (about 1.2x over 8 scored words; the quickstart's
    # model reaches several times the baseline), so the test asks only that it beats it.
    assert grounding["score"] > grounding["uniform_baseline"], grounding
    saved = json.loads((tmp_path / "scores_test.json").read_text())
    assert len(saved["per_image"]) == 12 and saved["grounding"]["score"] == grounding["score"]
    # its per-image CIDEr-D and ROUGE-L average to the corpus scores: the paired bootstrap's input
    for metric in ("CIDEr", "ROUGE_L"):
        scores = per_image_scores(tmp_path / "scores_test.json", metric)
        assert len(scores) == 12 and sum(scores.values()) / 12 == pytest.approx(saved["overall"][metric], abs=1e-9)
    # the results file it wrote is itself a valid input of the results-file mode
    assert main(["evaluate", "--results", str(tmp_path / "results_test.json"), "--annotations",
                 str(shapes_lstm.shapes / "captions_test.json"), "--json", "--out", str(tmp_path / "again.json")]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["scores"] == report["scores"]


def test_evaluate_grounding_with_an_instances_file(shapes_lstm: TrainedRun, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture) -> None:
    """--instances: the shapes file named explicitly scores as the one found by itself; a file
    without one of the objects the captions name scores the words naming it no more; a missing one is
    a one-line error."""
    from captioner.evaluation.grounding import Instances, shapes_regions

    found = evaluate_with_grounding(shapes_lstm.checkpoint, tmp_path / "found", capsys, "--fast")["grounding"]
    instances = shapes_lstm.shapes / "instances_test.json"
    named = evaluate_with_grounding(shapes_lstm.checkpoint, tmp_path / "named", capsys, "--fast", "--instances",
                                    str(instances))
    assert named["grounding"] == found and found["words"] > 0
    # The first object a caption names, and how many of its words name it.
    objects = Instances(instances)
    captions = json.loads((tmp_path / "found" / "results_test.json").read_text())
    named_objects = [o["id"] for c in captions for objs in shapes_regions(
        c["caption"].split(), objects.objects(c["image_id"]), objects.category_names).values() for o in objs]
    assert len(named_objects) == found["words"]
    data = json.loads(instances.read_text())
    data["annotations"] = [a for a in data["annotations"] if a["id"] != named_objects[0]]
    (tmp_path / "fewer.json").write_text(json.dumps(data))
    fewer = evaluate_with_grounding(shapes_lstm.checkpoint, tmp_path / "fewer", capsys, "--fast", "--instances",
                                    str(tmp_path / "fewer.json"))
    # A file that was not read would give exactly `found`.
    assert fewer["grounding"]["words"] == found["words"] - named_objects.count(named_objects[0])
    args = ["evaluate", str(shapes_lstm.checkpoint), "--grounding", "--fast", "--instances",
            str(tmp_path / "none.json"), "--out", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "none.json" in err and "Traceback" not in err and err.strip().count("\n") == 0


def test_resume_continues_from_the_saved_epoch(shapes_lstm: TrainedRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """A run resumed with two more epochs trains those two only, starting from the saved step,
    and keeps the saved rows. A resume that was ignored would train ten epochs from step 0."""
    import captioner.training.fit

    run = tmp_path / "run"
    shutil.copytree(shapes_lstm.run, run)  # the shared run stays as it is
    before = list(csv.DictReader(open(run / "metrics.csv")))
    epochs_run = []
    original = captioner.training.fit.train_one_epoch
    monkeypatch.setattr(captioner.training.fit, "train_one_epoch",
                        lambda *a, **k: epochs_run.append(1) or original(*a, **k))
    args = [*shapes_lstm.train_args[:-1], f"train.out_dir={run}", "train.epochs=10", "--resume"]
    with caplog.at_level(logging.INFO, logger="captioner.training.fit"):
        assert main(args) == 0
    saved_step = int(before[-1]["step"])
    assert "resumed from" in caplog.text and f"step {saved_step}" in caplog.text
    assert len(epochs_run) == 2
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [int(r["epoch"]) for r in rows] == list(range(1, 11))  # no epoch written twice
    assert [{k: float(v) for k, v in r.items()}
            for r in rows[:8]] == [{k: pytest.approx(float(v)) for k, v in r.items()} for r in before]
    steps_per_epoch = int(before[1]["step"]) - int(before[0]["step"])
    assert [int(r["step"]) for r in rows[8:]] == [saved_step + steps_per_epoch, saved_step + 2 * steps_per_epoch]


def test_a_run_trained_before_finished_json_is_trained_and_resumed_trains_no_step(
        shapes_lstm: TrainedRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The trained run without its finished.json, as one trained before that file was written: scripts/run_state.py
    calls it trained from its history, and a --resume (the sweeps gave one) trains no step, leaves its checkpoints
    and history as they were and writes the finished.json the training wrote."""
    import importlib.util

    import captioner.training.fit

    run = tmp_path / "run"
    shutil.copytree(shapes_lstm.run, run)  # the shared run stays as it is
    finished = json.loads((run / "finished.json").read_text())
    (run / "finished.json").unlink()
    spec = importlib.util.spec_from_file_location("run_state_e2e", REPO / "scripts" / "run_state.py")
    run_state = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_state)
    assert run_state.run_state(run) == "trained"
    kept = {name: (run / name).read_bytes() for name in ("last.pt", "best.pt", "metrics.csv", "step_losses.csv")}
    monkeypatch.setattr(captioner.training.fit, "train_one_epoch", lambda *a, **k: pytest.fail("a step trained"))
    with caplog.at_level(logging.INFO, logger="captioner.training.fit"):
        assert main([*shapes_lstm.train_args[:-1], f"train.out_dir={run}", "--resume"]) == 0
    assert "(all 8 epochs done): nothing to train, finished.json written" in caplog.text
    assert json.loads((run / "finished.json").read_text()) == finished
    assert {name: (run / name).read_bytes() for name in kept} == kept


def test_user_mistakes_are_one_line(shapes_lstm: TrainedRun, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", str(REPO / "configs/shapes_lstm.yaml"), "train.epochz=3"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "did you mean 'train.epochs'" in err
    assert main(["train", str(REPO / "configs/shapes_lstm.yaml"), "train.lr=.nan"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "'train.lr' must be a finite number > 0; got nan" in err
    assert main(["caption", str(shapes_lstm.root / "nope.pt"), "x.jpg"]) == 2
    assert "checkpoint not found" in capsys.readouterr().err


# --- the transformer, and the blind baseline ------------------------------------------------------

TRANSFORMER_TINY = [
    *(o for o in SHAPES_TINY if not o.startswith(("model.decoder.", "train.lr", "train.epochs", "train.warmup_steps"))),
    "model.decoder.d_model=64",
    "model.decoder.num_heads=4",
    "model.decoder.num_layers=2",
    "model.decoder.ff_dim=128",
    "model.decoder.dropout=0.0",
    "model.decoder.norm_first=true",  # pre-norm: stable at this learning rate from the first steps
    "train.epochs=6",
    "train.lr=3e-3",
    "train.warmup_steps=30",
    "train.val_max_images=12",
    "data.captions_per_image=all",  # as the LSTM: each image with its five captions
]


@pytest.fixture(scope="module")
def shapes_transformer(shapes_lstm: TrainedRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny transformer trained for seconds on the same shapes world (generated once)."""
    torch.set_num_threads(1)
    run = tmp_path_factory.mktemp("transformer")
    args = ["train", str(REPO / "configs/shapes_transformer.yaml"), *TRANSFORMER_TINY,
            f"data.root={shapes_lstm.shapes}", f"train.out_dir={run}"]
    assert main(args) == 0
    return run


def test_transformer_end_to_end(shapes_transformer: Path, shapes_lstm: TrainedRun, tmp_path: Path,
                                capsys: pytest.CaptureFixture) -> None:
    """Train, caption with heatmaps of every layer's heads, evaluate with grounding. Seconds of
    training teach the transformer the captions' language (the loss falls by more than half) but
    not yet to look: unlike the LSTM, it is not asked to name the image's objects above chance."""
    rows = list(csv.DictReader(open(shapes_transformer / "metrics.csv")))
    assert [int(r["epoch"]) for r in rows] == list(range(1, 7))
    assert float(rows[-1]["train_loss"]) < 0.5 * float(rows[0]["train_loss"])
    checkpoint = shapes_transformer / "last.pt"
    model = load_captioner(checkpoint)
    assert model.config.decoder.type == "transformer" and model.config.decoder.norm_first is True
    caption = model.caption(shapes_lstm.test_images[0])
    assert caption.attn.shape[1:3] == (2, 4)  # (T, layers, heads, h, w): every layer's heads kept for the maps
    rows = caption_json(checkpoint, shapes_lstm.test_images, capsys, "--beam", "3", "--heatmaps",
                        str(tmp_path / "maps"))
    assert len({r["caption"] for r in rows}) >= 2  # not one caption for every image
    vocab = set(model.vocab.words)
    for row in rows:
        assert row["caption"] and set(row["caption"].split()) <= vocab
        assert count_panels(row["heatmaps"]) == 1 + len(row["caption"].split())
    report = evaluate_with_grounding(checkpoint, tmp_path / "eval", capsys, "--fast", "--limit", "8")
    assert report["images"] == 8 and 0 < report["scores"]["Bleu_1"] <= 1
    assert report["grounding"]["instances"].endswith("instances_test.json")
    assert {"words", "score", "uniform_baseline"} <= set(report["grounding"])


def test_blind_model_writes_one_caption_for_every_image(shapes_lstm: TrainedRun, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    """model.blind zeroes the image features: trained and evaluated through the same CLI, it
    can only learn the language, so every image gets the same caption (the baseline that the
    tests above beat)."""
    torch.set_num_threads(1)
    run = tmp_path / "blind"
    args = [*shapes_lstm.train_args[:-1], f"train.out_dir={run}", "train.epochs=2", "model.blind=true"]
    assert main(args) == 0
    assert load_captioner(run / "best.pt").config.blind is True
    result = naming(run / "best.pt", shapes_lstm.shapes, capsys)
    assert result.distinct == 1  # one caption, whatever the image
    with pytest.raises(AssertionError):
        check_names_the_objects(result)  # the check the seeing models pass fails for it
    assert main(
        ["evaluate", str(run / "best.pt"), "--split", "test", "--fast", "--json", "--out", str(tmp_path / "eval")]) == 0
    results = json.loads((tmp_path / "eval" / "results_test.json").read_text())
    assert len({r["caption"] for r in results}) == 1
