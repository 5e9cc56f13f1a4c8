"""End to end through the CLI: generate shapes, train briefly, caption with heatmaps, evaluate, resume."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from captioner.checkpoint import load_captioner
from captioner.cli import main

pytestmark = pytest.mark.slow

TINY = [
    "data.shapes_num_train=300",
    "data.shapes_num_val=24",
    "data.shapes_num_test=12",
    "data.image_size=64",
    "data.batch_size=16",
    "model.encoder.width=16",
    "model.decoder.embed_dim=32",
    "model.decoder.hidden_dim=64",
    "model.decoder.attention_dim=32",
    "model.decoder.dropout=0.0",
    "train.epochs=8",
    "train.lr=3e-3",
    "train.warmup_steps=5",
    "train.early_stopping_patience=0",
    "decode.max_length=20",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("e2e")
    args = ["train", "configs/shapes_lstm.yaml", *TINY, f"data.root={root / 'shapes'}", f"train.out_dir={root / 'run'}"]
    assert main(args) == 0
    return root


def test_training_writes_checkpoints_logs_and_curves(trained: Path) -> None:
    run = trained / "run"
    for name in ("best.pt", "last.pt", "metrics.csv", "training_curves.png", "config.yaml", "vocab.json"):
        assert (run / name).is_file(), name
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [int(r["epoch"]) for r in rows] == list(range(1, 9))
    assert float(rows[-1]["train_loss"]) < float(rows[0]["train_loss"])  # it learns
    assert float(rows[-1]["val_Bleu_1"]) > 0.4  # its own greedy captions (untrained: < 0.15) match the references
    assert list((run / "tensorboard").iterdir())


def test_caption_with_heatmaps(trained: Path, capsys: pytest.CaptureFixture) -> None:
    images = sorted((trained / "shapes" / "test").iterdir())[:3]
    out = trained / "heatmaps"
    assert main(["caption", str(trained / "run" / "best.pt"), *map(str, images), "--beam", "3", "--json", "--heatmaps", str(out)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [Path(r["image"]).name for r in rows] == [p.name for p in images]
    for row in rows:
        words = row["caption"].split()
        assert words and set(words) <= set(load_captioner(trained / "run" / "best.pt").vocab.words)
        figure = Image.open(row["heatmaps"])
        assert figure.size[0] > 400  # an input panel and one panel per word


def test_caption_reports_bad_files_and_goes_on(trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good = sorted((trained / "shapes" / "test").iterdir())[0]
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff not really a jpeg")
    code = main(["caption", str(trained / "run" / "best.pt"), str(bad), str(good), str(tmp_path / "missing.png")])
    captured = capsys.readouterr()
    assert code == 1
    assert f"{good}\t" in captured.out
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and "broken.jpg" in errors[0] and "missing.png: no such file" in errors[1]
    assert "Traceback" not in captured.err


def test_evaluate_fast_writes_coco_results(trained: Path, capsys: pytest.CaptureFixture) -> None:
    out = trained / "eval_fast"
    args = ["evaluate", str(trained / "run" / "best.pt"), "--split", "test", "--beam", "3", "--fast", "--json", "--out", str(out)]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == 12 and set(report["scores"]) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr"}
    results = json.loads((out / "results_test.json").read_text())
    assert len(results) == 12 and set(results[0]) == {"image_id", "caption"}


@pytest.mark.skipif(shutil.which("java") is None, reason="the official metrics need Java")
def test_evaluate_official_with_grounding(trained: Path, capsys: pytest.CaptureFixture) -> None:
    out = trained / "eval"
    args = ["evaluate", str(trained / "run" / "best.pt"), "--split", "test", "--grounding", "--json", "--out", str(out),
            "--heatmaps", str(out / "figures")]
    assert main(args) == 0
    assert len(list((out / "figures").glob("*_grounding.png"))) == 8
    report = json.loads(capsys.readouterr().out)
    assert set(report["scores"]) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr"}
    grounding = report["grounding"]
    assert grounding["words"] > 0 and 0 < grounding["uniform_baseline"] < 0.5
    saved = json.loads((out / "scores_test.json").read_text())
    assert len(saved["per_image"]) == 12 and saved["grounding"]["score"] == grounding["score"]
    # the results file it wrote is itself a valid input of the results-file mode
    assert main(["evaluate", "--results", str(out / "results_test.json"), "--annotations",
                 str(trained / "shapes" / "captions_test.json"), "--json", "--out", str(out / "again.json")]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["scores"] == report["scores"]


def test_resume_continues_training(trained: Path) -> None:
    run = trained / "run"
    args = ["train", "configs/shapes_lstm.yaml", *TINY, f"data.root={trained / 'shapes'}", f"train.out_dir={run}"]
    assert main([*args, "train.epochs=9", "--resume"]) == 0
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [int(r["epoch"]) for r in rows] == list(range(1, 10))
    assert int(rows[8]["step"]) > int(rows[7]["step"])


def test_user_mistakes_are_one_line(trained: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "configs/shapes_lstm.yaml", "train.epochz=3"]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "did you mean 'train.epochs'" in err
    assert main(["caption", str(trained / "nope.pt"), "x.jpg"]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
