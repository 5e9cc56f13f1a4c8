"""The fast exact scorers give pycocoevalcap's numbers: BLEU, ROUGE-L and CIDEr-D in process on
real COCO captions and on edge cases, and the whole official evaluation (METEOR over parallel Java
processes included) against pycocoevalcap's own run on a subset of the official demo's results."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from helpers import require

from captioner.evaluation import meteor, metrics, scorers
from captioner.evaluation.metrics import OFFICIAL_KEYS, pycocoevalcap_scores, score_official, score_official_many
from captioner.evaluation.results_files import load_references, load_results
from captioner.text.tokenizer import tokenize

EDGE_REFS = [
    ["a dog runs on the grass", "a brown dog running", "dog"],
    ["a cat sits on a mat", "a cat a cat a cat on a mat"],
    ["two people ride bikes down the street"],
    ["a man", "a man riding a horse on a beach at sunset with a dog"],
    ["a b c d e f", "f e d c b a"],
]
EDGE_HYPS = ["", "a cat a cat on on a mat", "people", "a man riding a horse", "a b c d e f"]


@pytest.fixture(scope="module")
def demo(shared_data: Path) -> tuple[dict[int, list[str]], dict[int, str]]:
    """The official demo's fakecap results (1,000 images) and their references."""
    coco = shared_data / "coco"
    annotations, results = coco / "captions_val2014.json", coco / "captions_val2014_fakecap_results.json"
    require(annotations.is_file() and results.is_file(), f"COCO demo files not found in {coco}")
    references = load_references(annotations)
    predictions = load_results(results, references)
    return {i: references[i] for i in predictions}, predictions


def pycocoevalcap_in_process(hyps: list[str], refs: list[list[str]]) -> dict[str, tuple[float, list[float]]]:
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    gts = {i: list(r) for i, r in enumerate(refs)}
    res = {i: [h] for i, h in enumerate(hyps)}
    bleu, bleu_images = Bleu(4).compute_score(gts, res, verbose=0)
    scores = {f"Bleu_{n + 1}": (bleu[n], bleu_images[n]) for n in range(4)}
    scores["CIDEr"] = Cider().compute_score(gts, res)
    scores["ROUGE_L"] = Rouge().compute_score(gts, res)
    return scores


def ours(hyps: list[str], refs: list[list[str]]) -> dict[str, tuple[float, list[float]]]:
    counted = scorers.CountedCaptions.of(hyps, refs)
    bleu, bleu_images = scorers.bleu(counted)
    scores = {f"Bleu_{n + 1}": (bleu[n], bleu_images[n]) for n in range(4)}
    scores["CIDEr"] = scorers.cider_d(counted)
    scores["ROUGE_L"] = scorers.rouge_l(hyps, refs)
    return scores


def assert_same(expected: dict[str, tuple[float, list[float]]], got: dict[str, tuple[float, list[float]]]) -> None:
    assert set(got) == set(expected)
    for key, (corpus, images) in expected.items():
        assert got[key][0] == pytest.approx(corpus, abs=1e-12), key
        assert len(got[key][1]) == len(images)
        for i, (a, b) in enumerate(zip(got[key][1], images)):
            assert a == pytest.approx(b, abs=1e-12), (key, i)


def test_scorers_equal_pycocoevalcap_on_edge_cases() -> None:
    """An empty hypothesis, repeated n-grams to clip, lengths on both sides of every reference."""
    assert_same(pycocoevalcap_in_process(EDGE_HYPS, EDGE_REFS), ours(EDGE_HYPS, EDGE_REFS))


def test_scorers_equal_pycocoevalcap_on_the_official_demo(demo: tuple[dict[int, list[str]], dict[int, str]]) -> None:
    references, predictions = demo
    ids = sorted(predictions)[:400]
    hyps = [" ".join(tokenize(predictions[i])) for i in ids]
    refs = [[" ".join(tokenize(c)) for c in references[i]] for i in ids]
    expected = pycocoevalcap_in_process(hyps, refs)
    assert 0.1 < expected["CIDEr"][0] < 2  # real, imperfect captions
    assert_same(expected, ours(hyps, refs))


def test_lcs_length_equals_the_dynamic_programme() -> None:
    from pycocoevalcap.rouge.rouge import my_lcs

    rng = random.Random(0)
    for _ in range(500):
        a = [rng.choice("abcde") for _ in range(rng.randint(0, 15))]
        b = [rng.choice("abcde") for _ in range(rng.randint(0, 15))]
        assert scorers.lcs_length(a, b) == my_lcs(a, b) == scorers.lcs_length(b, a), (a, b)


def test_default_meteor_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(meteor.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(meteor, "_available_memory", lambda: 64 << 30)
    monkeypatch.setattr(meteor.os, "getloadavg", lambda: (0.3, 0.0, 0.0))
    assert meteor.default_processes(1000) == 1  # one JVM start beats two for a small set
    assert meteor.default_processes(12000) == 3
    assert meteor.default_processes(40504) == 8  # idle: one per core
    monkeypatch.setattr(meteor.os, "getloadavg", lambda: (6.5, 0.0, 0.0))
    assert meteor.default_processes(40504) == 2  # two cores free
    monkeypatch.setattr(meteor.os, "getloadavg", lambda: (12.0, 0.0, 0.0))
    assert meteor.default_processes(40504) == 1
    monkeypatch.setattr(meteor.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(meteor, "_available_memory", lambda: 5 << 30)
    assert meteor.default_processes(40504) == 2  # 2 GB each


def spaced_meteor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """METEOR run from a folder with a space in its name, as in a checkout under one: the jar's own
    lookup of its paraphrase table fails there, so every METEOR command must name the table by path."""
    spaced = tmp_path / "a b" / "meteor"
    spaced.mkdir(parents=True)
    shutil.copy(meteor.meteor_dir() / "meteor-1.5.jar", spaced)  # 6 MB: a link would be resolved by Java
    (spaced / "data").symlink_to(meteor.meteor_dir() / "data")
    for module in (meteor, metrics):
        monkeypatch.setattr(module, "meteor_dir", lambda: spaced)


@pytest.mark.usefixtures("java")
def test_official_scores_equal_pycocoevalcap_with_two_meteor_processes_and_several_jobs(
    demo: tuple[dict[int, list[str]], dict[int, str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """The demo's captions scored beside a second job with other captions and other references
    (each image's first reference against its others, a leave-one-out fold), from one start of
    each Java tool: the first job equals pycocoevalcap's own run (METEOR with its whole paraphrase
    table, against the cut one here: the same scores to the last bit), the second its own
    score_official call. METEOR runs from a folder with a space in its name, the reference's too."""
    spaced_meteor(tmp_path, monkeypatch)
    references, predictions = demo
    ids = sorted(predictions)[:150]
    subset = {i: predictions[i] for i in ids}
    fold = ({i: references[i][1:] for i in ids}, {i: references[i][0] for i in ids})
    expected, expected_images, _ = pycocoevalcap_scores(references, subset)
    fold_alone = score_official(*fold, meteor_processes=1)
    starts: dict[str, int] = {"PTB": 0, "METEOR": 0}
    tables = []
    run_java, pool_init = metrics.run_java, metrics.MeteorPool.__init__

    def counted_run_java(*args, **kwargs):
        starts["PTB"] += 1
        return run_java(*args, **kwargs)

    def counted_pool_init(self, *args, **kwargs):
        starts["METEOR"] += 1
        tables.append(args[1])
        pool_init(self, *args, **kwargs)

    monkeypatch.setattr(metrics, "run_java", counted_run_java)
    monkeypatch.setattr(metrics.MeteorPool, "__init__", counted_pool_init)
    got, got_fold = score_official_many([(references, subset), fold], meteor_processes=2)  # shards of 75 images
    assert starts == {"PTB": 1, "METEOR": 1}
    assert tables[0] is not None  # METEOR read its paraphrase table cut to these captions' words
    assert tuple(got.overall) == OFFICIAL_KEYS
    for key in OFFICIAL_KEYS:
        assert got.overall[key] == pytest.approx(expected[key], abs=1e-12), key
        for i in ids:
            assert got.per_image[i][key] == pytest.approx(expected_images[i][key], abs=1e-12), (key, i)
    assert 0.1 < got.overall["METEOR"] < 0.5
    assert set(got.seconds) >= {"PTB tokenizer", "BLEU", "ROUGE-L", "CIDEr-D", "METEOR", "total"}
    assert got_fold.overall == fold_alone.overall and got_fold.per_image == fold_alone.per_image
    assert got_fold.references == fold_alone.references and got_fold.predictions == fold_alone.predictions
    assert got_fold.overall["CIDEr"] != got.overall["CIDEr"]
