"""The paired bootstrap of captioner/evaluation/significance.py and scripts/paired_bootstrap.py."""

from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path

import pytest

from captioner.core.errors import CaptionerError
from captioner.evaluation.significance import paired_bootstrap, per_image_scores

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import paired_bootstrap as script  # noqa: E402


def scores_file(path: Path, scores: dict[int, float], metric: str = "CIDEr", overall: float | None = None) -> Path:
    mean = sum(scores.values()) / len(scores)
    report = {"overall": {metric: mean if overall is None else overall},
              "per_image": [{"image_id": i, metric: s} for i, s in scores.items()]}
    path.write_text(json.dumps(report))
    return path


def test_a_uniform_lift_is_certain_and_exact() -> None:
    base = {i: 0.1 + 0.05 * i for i in range(20)}
    result = paired_bootstrap(base, {i: 1.2 * s for i, s in base.items()}, samples=500, goal=0.15)
    assert result.gain == pytest.approx(0.2) and result.low == pytest.approx(0.2) and result.high == pytest.approx(0.2)
    assert result.p_positive == 1.0 and result.p_goal == 1.0 and result.images == 20
    same = paired_bootstrap(base, dict(base), samples=500, goal=0.0)
    assert same.gain == 0 and same.low == same.high == 0 and same.p_positive == 0.0 and same.p_goal == 1.0


def test_the_share_of_draws_matches_the_exact_bootstrap_distribution() -> None:
    """Three images, base 1 everywhere, new 2, 1, 0: the new mean is higher in a draw exactly
    when it holds image 0 more often than image 2. Over the 27 equally likely draws that is 10."""
    base, new = {0: 1.0, 1: 1.0, 2: 1.0}, {0: 2.0, 1: 1.0, 2: 0.0}
    exact = sum(draw.count(0) > draw.count(2) for draw in itertools.product(range(3), repeat=3)) / 27
    assert exact == pytest.approx(10 / 27)
    result = paired_bootstrap(base, new, samples=40_000, seed=1)
    assert result.gain == 0 and result.p_positive == pytest.approx(exact, abs=0.01)
    # The gain is (n0 - n2) / 3; its extremes, all image 2 (-1) or all image 0 (+1), each have
    # probability 1/27 > 2.5%, so they are the interval's ends.
    assert result.low == pytest.approx(-1) and result.high == pytest.approx(1)


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    good = scores_file(tmp_path / "a.json", {1: 0.5, 2: 0.7})
    with pytest.raises(CaptionerError, match="Bleu_4.*mean of its per-image"):
        per_image_scores(good, "Bleu_4")
    with pytest.raises(CaptionerError, match="missing.json: no scores file"):
        per_image_scores(tmp_path / "missing.json", "CIDEr")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(CaptionerError, match="broken.json: not valid JSON"):
        per_image_scores(tmp_path / "broken.json", "CIDEr")
    (tmp_path / "plain.json").write_text(json.dumps({"overall": {"CIDEr": 0.6}}))
    with pytest.raises(CaptionerError, match="plain.json: no 'per_image' scores"):
        per_image_scores(tmp_path / "plain.json", "CIDEr")
    with pytest.raises(CaptionerError, match="do not average to the overall"):
        per_image_scores(scores_file(tmp_path / "off.json", {1: 0.5, 2: 0.7}, overall=0.9), "CIDEr")
    other = scores_file(tmp_path / "b.json", {1: 0.5, 3: 0.7})
    with pytest.raises(CaptionerError, match="different images"):
        paired_bootstrap(per_image_scores(good, "CIDEr"), per_image_scores(other, "CIDEr"))


@pytest.mark.parametrize("text, says", [
    ("[" * 100_000, "nested deeper than the 32 levels a scores file may have"),
    ('{"per_image": [{"image_id": 1' + "0" * 5000 + ', "CIDEr": 0.5}]}', "a number of thousands of digits"),
    ('{"overall": [1], "per_image": [{"image_id": 1, "CIDEr": NaN}]}', "'CIDEr' that is not a finite number"),
    ('{"overall": {"CIDEr": "0.5"}, "per_image": [{"image_id": 1, "CIDEr": 0.5}]}', "overall.CIDEr is '0.5', not a"),
    ('{"overall": [0.5], "per_image": [{"image_id": 1e400, "CIDEr": 0.5}]}', "lack an image_id or a numeric"),
], ids=["nested", "long number", "NaN", "overall a string", "id infinite"])
def test_a_damaged_scores_file_is_one_line(tmp_path: Path, text: str, says: str) -> None:
    """A scores file of another's, or edited by hand: each was a traceback (a RecursionError, a ValueError, an
    AttributeError, a TypeError) or a NaN gain."""
    path = tmp_path / "scores_test.json"
    path.write_text(text)
    with pytest.raises(CaptionerError, match=f"^{re.escape(str(path))}: .*{re.escape(says)}"):
        per_image_scores(path, "CIDEr")


def test_the_script_reads_run_folders(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for run, lift in (("ce", 1.0), ("scst", 1.5)):
        (tmp_path / run).mkdir()
        scores_file(tmp_path / run / "scores_test.json", {i: lift * (0.2 + 0.1 * i) for i in range(5)})
    assert script.main([str(tmp_path / "ce"), str(tmp_path / "scst"), "--goal", "0.1", "--samples", "200"]) == 0
    out = capsys.readouterr().out
    assert "CIDEr on 5 images: 0.4000 -> 0.6000, gain +50.0% (95% interval +50.0% to +50.0%; 200 paired draws)" in out
    assert "new run higher in 100.0% of draws; gain >= 10% in 100.0%" in out
    assert script.main([str(tmp_path / "ce"), str(tmp_path / "nowhere")]) == 2
    assert "error: " in capsys.readouterr().err
