"""scripts/flickr8k_report.py on a miniature of the real Flickr8k test split: the scores it
tables are the runs' own, the human row and caption statistics are computed, and the gallery and
worst-images sheets are written; a run without its results is one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import REPO, subprocess_env, tiny_config, tiny_model
import warm_start
from PIL import Image
from test_flickr8k import flickr8k_224, subset  # noqa: F401 - the fixture is used by name

from captioner.data.flickr8k import TOKEN_FILE, read_token_file
from captioner.evaluation.metrics import fast_scores
from captioner.evaluation.scorers import CountedCaptions, cider_d
from captioner.evaluation.results_files import write_results, write_scores_json
from captioner.models.checkpoint import save_checkpoint


def fake_run(folder: Path, root: Path, captions: dict[int, str], references: dict[int, list[str]]) -> None:
    overrides = ("data.dataset=flickr8k", f"data.root={root}")
    folder.mkdir(parents=True)
    save_checkpoint(folder / "best.pt", tiny_model(*overrides), tiny_config(*overrides))
    write_results(folder / "results_test.json", captions)
    ids = sorted(captions)  # the test's captions are lower case without punctuation: no tokenizer needed
    _, cider = cider_d(CountedCaptions.of([captions[i] for i in ids], [references[i] for i in ids]))
    write_scores_json(folder / "scores_test.json", fast_scores(references, captions),
                      {i: {"CIDEr": c} for i, c in zip(ids, cider)})


def test_report_on_a_miniature_test_split(flickr8k_224: tuple[Path, Path], tmp_path: Path) -> None:  # noqa: F811
    root = tmp_path / "flickr8k"
    chosen = subset(*flickr8k_224, root, {"train": 4, "val": 1, "test": 6})
    all_captions = read_token_file(root / TOKEN_FILE)
    ids = {name: i for i, name in enumerate(all_captions)}
    references = {ids[name]: all_captions[name] for name in chosen["test"]}
    copied = all_captions[chosen["train"][0]][0]  # one training caption, said of every test image
    fake_run(tmp_path / "near", root, {i: refs[1] for i, refs in references.items()}, references)
    fake_run(tmp_path / "stock", root, dict.fromkeys(references, copied), references)

    out = tmp_path / "report"
    result = warm_start.run(
        [sys.executable, str(REPO / "scripts" / "flickr8k_report.py"), "--run", f"near={tmp_path / 'near'}",
         "--run", f"stock={tmp_path / 'stock'}", "--best", "stock", "--out", str(out), "--fast"],
        capture_output=True, text=True, timeout=600, env=subprocess_env(),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    for name in ("near", "stock"):
        assert report["scores"][name] == json.loads((tmp_path / name / "scores_test.json").read_text())["overall"]
    loo = report["leave_one_out"]
    assert loo["folds"] == 5 and loo["stock"]["CIDEr"] < loo["human"]["CIDEr"]
    stats = report["caption_stats"]
    assert stats["stock"]["copied_share"] == 1.0 and stats["stock"]["distinct_share"] == pytest.approx(1 / 6)
    assert stats["near"]["copied_share"] == 0.0 and stats["near"]["distinct_share"] == 1.0
    worst = [w["CIDEr"] for w in report["worst"]]
    assert len(worst) == 6 and worst == sorted(worst)
    assert {w["caption"] for w in report["worst"]} == {copied}
    assert sorted(report["gallery"]) == sorted(chosen["test"])  # 12 wanted, 6 there: all of them
    for figure in ("gallery.jpg", "worst.jpg"):
        with Image.open(out / figure) as sheet:
            assert sheet.width > 500 and sheet.height > 300
    assert "| human |" in (out / "report.md").read_text()
    stock_words = copied.lower().rstrip(" .").split()
    assert {w["word"] for w in report["unmatched_words"]} <= set(stock_words)
    assert sum(w["used"] for w in report["unmatched_words"]) <= 6 * len(stock_words)

    (tmp_path / "stock" / "results_test.json").unlink()
    broken = warm_start.run(
        [sys.executable, str(REPO / "scripts" / "flickr8k_report.py"), "--run", f"stock={tmp_path / 'stock'}",
         "--best", "stock", "--out", str(out), "--no-human"], capture_output=True, text=True, timeout=600,
         env=subprocess_env(),
    )
    assert (broken.returncode == 2 and broken.stderr.count("\n") == 1
            and "results_test.json: no results file" in broken.stderr)
