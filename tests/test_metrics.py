"""The official COCO metrics and their files: the official demo reproduced (metrics), input
errors and the scores file (results_files), fast scores, Java and SPICE (java)."""

from __future__ import annotations

import json
import logging
import math
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import optional, require, subprocess_env
import warm_start

from captioner.core.errors import CaptionerError, DatasetError
from captioner.evaluation import java, spice_models
from captioner.evaluation.evaluate import caption_records, encode_records, evaluate, references_for, score_predictions
from captioner.evaluation.metrics import OFFICIAL_KEYS, evaluate_results_file, fast_scores, official_scores
from captioner.evaluation.results_files import (
    load_references,
    load_results,
    rounded,
    scored_ids,
    write_results,
    write_scores_json,
)

needs_java = pytest.mark.usefixtures("java")  # skips locally without Java, fails under CI=true (conftest.py)

# Printed by the official coco-caption demo notebook (tylin/coco-caption, cocoEvalCapDemo.ipynb)
# for results/captions_val2014_fakecap_results.json against annotations/captions_val2014.json.
PUBLISHED = {
    "Bleu_1": 0.579, "Bleu_2": 0.404, "Bleu_3": 0.279, "Bleu_4": 0.191,
    "METEOR": 0.195, "ROUGE_L": 0.396, "CIDEr": 0.600,
}
# The same notebook prints BLEU's n-gram statistics: {'reflen': 9855, 'testlen': 9893,
# 'guess': [9893, 8893, 7893, 6893], 'correct': [5732, 2510, 1043, 423]}. testlen > reflen, so
# no brevity penalty and BLEU-n is the geometric mean of the first n precisions.
_PRECISIONS = [c / g for c, g in zip([5732, 2510, 1043, 423], [9893, 8893, 7893, 6893])]
PUBLISHED_BLEU_EXACT = {f"Bleu_{n}": math.prod(_PRECISIONS[:n]) ** (1 / n) for n in range(1, 5)}


@pytest.fixture(scope="module")
def demo_scores(shared_data: Path, java: str) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    coco = shared_data / "coco"
    annotations, results = coco / "captions_val2014.json", coco / "captions_val2014_fakecap_results.json"
    require(annotations.is_file() and results.is_file(), f"COCO demo files not found in {coco}")
    return evaluate_results_file(results, annotations)


def test_official_demo_reproduced(demo_scores: tuple[dict[str, float], dict[int, dict[str, float]]]) -> None:
    overall, per_image = demo_scores
    assert set(overall) == set(PUBLISHED)  # no SPICE unless asked
    for key, published in PUBLISHED.items():
        # Published with 3 decimals: ours must round to exactly that.
        assert overall[key] == pytest.approx(published, abs=5e-4), key
    for key, exact in PUBLISHED_BLEU_EXACT.items():
        assert overall[key] == pytest.approx(exact, abs=1e-9), key
    assert len(per_image) == 1000
    assert all(set(scores) == set(PUBLISHED) for scores in per_image.values())
    # The notebook shows image 184321 ("train traveling down a track in front of a road") with
    # "CIDEr score 1.0": a check that per-image scores land on the right image.
    assert per_image[184321]["CIDEr"] == pytest.approx(1.0, abs=0.05)
    # Corpus CIDEr-D is the mean of the per-image scores.
    assert sum(s["CIDEr"] for s in per_image.values()) / 1000 == pytest.approx(overall["CIDEr"], abs=1e-9)


# --- loading and its errors --------------------------------------------------------------------

REFS = {1: ["a dog runs on the grass", "a brown dog running"], 2: ["a cat sits on a mat"], 3: ["two people ride bikes"]}


def _write(path: Path, content: object | str) -> Path:
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def test_load_references_and_results(tmp_path: Path) -> None:
    annotations = {
        "images": [{"id": 1}, {"id": 2}, {"id": 4}],
        "annotations": [
            {"image_id": 1, "id": 10, "caption": "A dog."},
            {"image_id": 2, "id": 11, "caption": "A cat."},
            {"image_id": 1, "id": 12, "caption": "Another dog."},
        ],
    }
    refs = load_references(_write(tmp_path / "ann.json", annotations))
    assert refs == {1: ["A dog.", "Another dog."], 2: ["A cat."]}
    preds = load_results(_write(tmp_path / "res.json", [{"image_id": 2, "caption": "a cat", "score": 0.5}]), refs)
    assert preds == {2: "a cat"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"annotations": [', r"ann\.json: not valid JSON \(.* at line 1 column 18\)"),
        ([1, 2], r"ann\.json: expected a COCO caption annotation object, got a JSON list"),
        ({"images": []}, r'ann\.json: missing "annotations"'),
        ({"annotations": [{"image_id": 1, "caption": "x"}, {"image_id": 2}]}, r'annotations\[1\] has no "caption"'),
        ({"annotations": [{"image_id": "1", "caption": "x"}]}, r'"image_id" must be an integer'),
    ],
)
def test_load_references_errors(tmp_path: Path, content: object, message: str) -> None:
    with pytest.raises(DatasetError, match=message):
        load_references(_write(tmp_path / "ann.json", content))


def test_load_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"nope\.json: annotation file not found"):
        load_references(tmp_path / "nope.json")
    with pytest.raises(DatasetError, match=r"nope\.json: results file not found"):
        load_results(tmp_path / "nope.json", REFS)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('[{"image_id": 1, "caption": "a dog"},\n {"image_id": 2 "caption": "x"}]',
         r"res\.json: not valid JSON \(Expecting ',' delimiter at line 2 column 17\)"),
        ({"image_id": 1, "caption": "a dog"}, r"res\.json: expected a JSON list of .* objects, got a JSON dict"),
        ([], r"res\.json: no results"),
        ([{"image_id": 1, "caption": "a dog"}, "a cat"], r"res\.json: item 1 is a str, expected a JSON list"),
        ([{"image_id": 1, "text": "a dog"}], r'res\.json: item 0 has no "caption"'),
        ([{"caption": "a dog"}], r'res\.json: item 0 has no "image_id"'),
        ([{"image_id": "1", "caption": "a dog"}], r"""item 0: "image_id" must be an integer, got '1'"""),
        ([{"image_id": 1, "caption": ["a", "dog"]}], r'item 0 \(image 1\): "caption" must be a string'),
        ([{"image_id": 1, "caption": "a dog"}, {"image_id": 2, "caption": "  "}],
         r"res\.json: item 1 \(image 2\) has an empty caption"),
        ([{"image_id": 1, "caption": "a dog"}, {"image_id": 2, "caption": "a cat"}, {"image_id": 1, "caption": "x"}],
         r"res\.json: image 1 has more than one caption \(items 0 and 2\)"),
        ([{"image_id": i, "caption": "a dog"} for i in [1, 2, 3, 101, 102, 103, 104, 105, 106, 107]],
         r"res\.json: 7 of 10 image ids are not in the annotations \(101, 102, 103, 104, 105, \.\.\.\)"),
    ],
    ids=["json", "not-list", "empty", "not-object", "no-caption", "no-id", "id-type", "caption-type",
         "empty-caption", "duplicate", "unknown-ids"],
)
def test_load_results_errors(tmp_path: Path, content: object, message: str) -> None:
    with pytest.raises(DatasetError, match=message) as info:
        load_results(_write(tmp_path / "res.json", content), REFS)
    assert "\n" not in str(info.value)


# --- Java -----------------------------------------------------------------------------------------


def test_java_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no java
    with pytest.raises(CaptionerError, match=r"^Java not found: .*Java 8\+ runtime on PATH"):
        official_scores(REFS, {1: "a dog runs"})


# --- fast scores ------------------------------------------------------------------------------


def test_fast_scores_perfect_and_wrong() -> None:
    refs = {
        1: ["a dog runs across the green grass", "a brown dog running in a park"],
        2: ["a cat sleeps on a red mat", "a small cat lying on a mat"],
        3: ["two people ride bikes down the street", "two cyclists on a city road"],
    }
    perfect = fast_scores(refs, {i: captions[0] for i, captions in refs.items()})
    assert set(perfect) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr"}
    assert perfect["Bleu_4"] == pytest.approx(1.0, abs=1e-6)
    assert perfect["Bleu_1"] == pytest.approx(1.0, abs=1e-6)
    wrong = fast_scores(refs, {1: "an airplane parked at the airport", 2: "pizza with cheese", 3: "a clock tower"})
    assert wrong["Bleu_4"] < 0.01
    assert wrong["CIDEr"] < 0.1 < perfect["CIDEr"]
    # Tokenised like the PTB tokenizer: case and punctuation do not matter.
    shouted = fast_scores(refs, {i: captions[0].upper() + "." for i, captions in refs.items()})
    assert shouted == pytest.approx(perfect)


def test_fast_scores_needs_references() -> None:
    with pytest.raises(DatasetError, match=r"1 predicted image ids have no reference captions \(9\)"):
        fast_scores(REFS, {1: "a dog", 9: "a cat"})
    with pytest.raises(DatasetError, match="no predictions"):
        fast_scores(REFS, {})
    # score_predictions' fast path checks the ids before it tokenises or counts anything
    with pytest.raises(DatasetError, match=r"1 predicted image ids have no reference captions \(9\)"):
        score_predictions(REFS, {1: "a dog", 9: "a cat"}, official=False)
    with pytest.raises(DatasetError, match="no predictions"):
        score_predictions(REFS, {}, official=False)


SIMPLE_REFS = {
    10: ["a man riding a wave on top of a surfboard", "a surfer rides a large wave in the ocean"],
    11: ["a plate of food with broccoli and rice", "a white plate topped with rice and vegetables"],
    12: ["a giraffe standing next to a tall tree", "a tall giraffe eating leaves from a tree"],
    13: ["a red double decker bus on a city street", "a bus driving down a busy street"],
    14: ["a woman holding an umbrella in the rain", "a person walking with an umbrella on a rainy day"],
}
SIMPLE_PREDS = {
    10: "a man riding a wave on a surfboard",
    11: "a plate of rice and broccoli",
    12: "a giraffe standing next to a tree",
    13: "a bus on a street",
    14: "a woman with an umbrella walking in the rain",
}


@needs_java
def test_fast_and_official_agree(capfd: pytest.CaptureFixture[str]) -> None:
    overall, per_image = official_scores(SIMPLE_REFS, SIMPLE_PREDS)
    fast = fast_scores(SIMPLE_REFS, SIMPLE_PREDS)
    for key in ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr"):
        assert fast[key] == pytest.approx(overall[key], abs=1e-6), key
    assert 0.3 < overall["Bleu_4"] < 1.0
    assert set(per_image) == set(SIMPLE_PREDS)
    # pycocoevalcap's prints and the Java tools' stderr go to the log, not the terminal.
    out, err = capfd.readouterr()
    assert "tokenization" not in out and "computing" not in out and "ratio" not in out
    assert "PTBTokenizer" not in err


# --- SPICE ------------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_java
def test_spice_skipped_with_one_warning_when_models_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # No models (an empty lib folder), and a download address that refuses at once: no network.
    monkeypatch.setattr(spice_models, "_spice_lib_dir", lambda: tmp_path / "lib")
    monkeypatch.setattr(spice_models, "_spice_models_url", lambda: f"http://127.0.0.1:{_closed_port()}/corenlp.zip")
    monkeypatch.setattr(spice_models, "SPICE_PROBE_TIMEOUT_S", 10.0)

    def no_download() -> str:
        raise AssertionError("must not download when the address is unreachable")

    monkeypatch.setattr(spice_models, "_download_spice_models", no_download)
    # A carriage return inside a caption must not shift captions between images (the Java PTB
    # tokenizer would read it as a line end).
    refs = {**SIMPLE_REFS, 15: ["a black dog catching a frisbee", "a dog jumps to catch a frisbee"]}
    preds = {**SIMPLE_PREDS, 15: "a black dog\rcatching a frisbee"}
    with caplog.at_level(logging.WARNING, logger="captioner.evaluation"):
        overall, per_image = official_scores(refs, preds, spice=True)
    assert "SPICE" not in overall and all("SPICE" not in s for s in per_image.values())
    assert set(overall) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr"}
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert message.startswith("SPICE skipped: the Stanford CoreNLP 3.6.0 models are not in")
    assert "unreachable" in message and "get_stanford_models" in message and "\n" not in message
    assert per_image[15]["Bleu_4"] == pytest.approx(1.0, abs=1e-6)


def test_spice_partial_install_not_downloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "stanford-corenlp-3.6.0.jar").write_bytes(b"")
    monkeypatch.setattr(spice_models, "_spice_lib_dir", lambda: lib)
    monkeypatch.setattr(spice_models, "_probe_spice_models_url", lambda: pytest.fail("no probe expected"))
    with caplog.at_level(logging.WARNING, logger="captioner.evaluation.spice_models"):
        assert spice_models.ensure_spice_models() is False
    assert len(caplog.records) == 1
    assert "stanford-corenlp-3.6.0-models.jar is missing" in caplog.records[0].getMessage()


@needs_java
def test_spice_java_runs_with_options_and_fails_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="captioner.evaluation.java"):
        java._spice_check_call(["java", "-version"], cwd=tmp_path)
    assert "--add-opens=java.base/java.lang=ALL-UNNAMED" in caplog.text  # Java 9+ echoes JDK_JAVA_OPTIONS
    with pytest.raises(CaptionerError, match=r"^SPICE failed \(java exit status 1\): .*nonexistent\.jar") as info:
        java._spice_check_call(["java", "-jar", "nonexistent.jar"], cwd=tmp_path)
    assert "\n" not in str(info.value)


@needs_java
def test_spice_runs_when_models_present(caplog: pytest.LogCaptureFixture) -> None:
    optional(not spice_models.missing_spice_models(), "SPICE models",
             "SPICE's Stanford CoreNLP models are not installed")
    refs = {i: SIMPLE_REFS[i] for i in (10, 12)}
    preds = {i: SIMPLE_PREDS[i] for i in (10, 12)}
    with caplog.at_level(logging.WARNING, logger="captioner.evaluation"):
        overall, per_image = official_scores(refs, preds, spice=True)
    assert not caplog.records
    assert 0.0 < overall["SPICE"] <= 1.0
    assert all(0.0 <= per_image[i]["SPICE"] <= 1.0 for i in refs)


# --- writing -------------------------------------------------------------------------------------


def test_write_scores_json(tmp_path: Path) -> None:
    path = tmp_path / "out" / "scores.json"
    overall = {"Bleu_4": 0.25, "CIDEr": 0.5}
    per_image = {7: {"Bleu_4": 0.5, "CIDEr": float("nan")}, 3: {"Bleu_4": 0.0, "CIDEr": 1.0}}
    write_scores_json(path, overall, per_image, extra={"results": "res.json", "split": "val"})
    data = json.loads(path.read_text())
    assert data["overall"] == overall and data["num_images"] == 2
    assert data["per_image"] == [
        {"image_id": 3, "Bleu_4": 0.0, "CIDEr": 1.0},
        {"image_id": 7, "Bleu_4": 0.5, "CIDEr": None},
    ]
    assert data["results"] == "res.json" and data["split"] == "val"
    with pytest.raises(ValueError, match="overall"):
        write_scores_json(path, overall, per_image, extra={"overall": 1})


def test_a_file_nested_past_pythons_limit_is_not_a_scores_file(tmp_path: Path) -> None:
    """`evaluate --out` on such a file raised json's RecursionError; it is another file, kept."""
    from captioner.evaluation.results_files import is_scores_file

    deep = tmp_path / "mine.json"
    deep.write_text("[" * 5000 + "]" * 5000)
    assert not is_scores_file(deep)
    write_scores_json(tmp_path / "scores.json", {"CIDEr": 1.0}, {1: {"CIDEr": 1.0}})
    assert is_scores_file(tmp_path / "scores.json")


def test_a_users_own_large_scores_file_is_read_where_one_beside_a_model_is_capped(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An evaluation of over 110,000 images writes a scores file past the 32 MiB cap of a model's: `evaluate --out`
    must still replace it and the tables read it, while the same file beside someone's checkpoint is left out."""
    from captioner.core.bounded_files import SCORES_JSON_BYTES
    from captioner.evaluation.results_files import is_scores_file, read_scores_file
    from captioner.models.model_origin import recorded_scores

    path = tmp_path / "scores_test.json"
    write_scores_json(path, {"CIDEr": 1.0}, {1: {"CIDEr": 1.0}}, extra={"note": "x" * SCORES_JSON_BYTES})
    assert is_scores_file(path) and read_scores_file(path, "evaluate first")["overall"] == {"CIDEr": 1.0}
    with caplog.at_level("WARNING"):
        assert recorded_scores(path) is None
    assert "33.6 MB" in caplog.records[-1].getMessage()


def test_results_file_written_is_read_back(tmp_path: Path) -> None:
    path = write_results(tmp_path / "out" / "results.json", {3: "a cat", 1: "a dog"})
    assert [row["image_id"] for row in json.loads(path.read_text())] == [1, 3]  # sorted, like the scores file
    assert load_results(path, {1: ["x"], 3: ["y"]}) == {1: "a dog", 3: "a cat"}
    (tmp_path / "a_file").write_text("")
    with pytest.raises(CaptionerError, match=r"^.*a_file/results\.json: cannot write it ") as info:
        write_results(tmp_path / "a_file" / "results.json", {1: "a dog"})
    assert "\n" not in str(info.value)


def test_scored_ids_are_sorted_and_rounded_keeps_four_decimals() -> None:
    # SPICE returns per-image scores in sorted id order: every scorer must see the ids that way.
    assert scored_ids(REFS, {3: "x", 1: "y", 2: "z"}) == [1, 2, 3]
    assert rounded({"CIDEr": 0.123456, "Bleu_4": 0.99995}) == {"CIDEr": 0.1235, "Bleu_4": 1.0}


def test_line_ends_inside_a_caption_become_spaces() -> None:
    assert java.one_line(
        "a dog\rrunning\u2028on\x0bthe\x0cgreen\x85grass\u2029now") == "a dog running on the green grass now"
    assert java.one_line("a plain caption, unchanged") == "a plain caption, unchanged"


# --- the library evaluation and the CLI over it --------------------------------------------------

# Each prediction is its image's only reference: nltk BLEU-4 is exactly 1, and the statistics
# are known by hand ("a dog on a dog" repeats "a dog"; "a cat on the" ends on "the").
OWN_REFERENCES = {1: ["a dog on a dog"], 2: ["a cat on the"]}
OWN_PREDICTIONS = {1: "a dog on a dog", 2: "a cat on the"}


def test_score_predictions_fast() -> None:
    scores = score_predictions(OWN_REFERENCES, OWN_PREDICTIONS, official=False)
    assert scores.overall == fast_scores(OWN_REFERENCES, OWN_PREDICTIONS) and scores.per_image == {}
    assert scores.metrics == "fast (in-process BLEU, CIDEr-D)"
    assert scores.tutorial_bleu["nltk_corpus_BLEU_4"] == pytest.approx(1.0)
    assert scores.caption_stats == {"bad_ending_rate": 0.5, "repeated_bigram_rate": 0.5, "mean_length": 4.5}
    beside = scores.beside_official()
    assert (beside["tutorial_bleu"]["label"].startswith("tutorial-style")
            and beside["tutorial_bleu"]["nltk_corpus_BLEU_4"] == 1.0)


@needs_java
def test_score_predictions_official() -> None:
    scores = score_predictions(SIMPLE_REFS, SIMPLE_PREDS)
    overall, per_image = official_scores(SIMPLE_REFS, SIMPLE_PREDS)
    assert scores.overall == overall and scores.per_image == per_image
    assert tuple(scores.overall) == OFFICIAL_KEYS and scores.metrics == "official (pycocoevalcap)"
    assert 0.3 < scores.tutorial_bleu["nltk_corpus_BLEU_4"] < 1.0


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny LSTM over a 4-image shapes test split, saved with its run config."""
    from helpers import tiny_config, tiny_model

    from captioner.data.shapes import generate_shapes
    from captioner.models.checkpoint import save_checkpoint

    root = tmp_path_factory.mktemp("tiny_eval")
    generate_shapes(root / "shapes", 0, 0, 4, image_size=32, progress=False)
    overrides = (f"data.root={root / 'shapes'}", "decode.max_length=6")
    save_checkpoint(root / "model.pt", tiny_model(*overrides), tiny_config(*overrides))
    return root / "model.pt"


def test_evaluate_is_what_the_cli_reports(tiny_checkpoint: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from captioner.apps.cli import main
    from captioner.data.datasets import load_split
    from captioner.data.records import ImageRecord
    from captioner.models.checkpoint import checkpoint_config, load_captioner

    model = load_captioner(tiny_checkpoint, "cpu")
    records = load_split(checkpoint_config(tiny_checkpoint).data, "test")
    evaluation = evaluate(model, records, official=False, results_file=tmp_path / "mine.json", beam_size=2,
                          progress=False)
    assert (set(evaluation.captions) == {r.image_id for r in records} and evaluation.references
            == references_for(records, evaluation.captions))
    assert load_results(tmp_path / "mine.json", evaluation.references) == evaluation.predictions
    assert evaluation.scores.overall == fast_scores(evaluation.references, evaluation.predictions)
    assert evaluation.grounding is None

    # saved outside a run folder: named, as for anyone's checkpoint
    shapes = f"data.root={checkpoint_config(tiny_checkpoint).data.root}"
    assert main(["evaluate", str(tiny_checkpoint), shapes, "--split", "test", "--fast", "--beam", "2", "--json",
                 "--out", str(tmp_path / "cli")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["scores"] == rounded(evaluation.scores.overall) and report["images"] == len(records)
    assert report["tutorial_bleu"] == evaluation.scores.beside_official()["tutorial_bleu"]
    assert report["decode"] == {"beam_size": 2} and report["metrics"] == evaluation.scores.metrics
    assert (tmp_path / "cli" / "results_test.json").read_text() == (tmp_path / "mine.json").read_text()

    # Encoded once in memory, decoded from the features: the same captions; an image that does
    # not load is left out of both.
    broken = ImageRecord(999, tmp_path / "missing.png", ("a red circle",))
    encoded = encode_records(model, [*records, broken], progress=False)
    assert [r.image_id for r in encoded.records] == [r.image_id for r in records]
    assert encoded.features.shape[:2] == (len(records), encoded.grid[0] * encoded.grid[1])  # (n, N, D)
    again = caption_records(model, encoded.records, features=encoded.features, grid=encoded.grid, beam_size=2,
                            progress=False)
    assert {i: c.text for i, c in again.items()} == evaluation.predictions


LOADED = ("import json, sys, {module}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} | {{m for m in "
          "sys.modules if m.startswith(('captioner.', 'torch.'))}})))")


def loaded_by(module: str) -> set[str]:
    result = subprocess.run([sys.executable, "-c", LOADED.format(module=module)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return set(json.loads(result.stdout))  # top-level packages, and every captioner and torch module


def test_the_evaluation_library_loads_no_app_and_the_metric_stack_only_when_scoring() -> None:
    """pycocoevalcap and nltk load when scores are computed, not on import; the library imports no
    app, figure or training code, nor torchvision, dynamo or torch.onnx (a second each of the command's
    start; the loaders' pictures are Pillow's); `captioner evaluate --help` needs no torch."""
    library = loaded_by("captioner.evaluation.evaluate")
    assert "torch" in library and "captioner.evaluation.metrics" in library and "captioner.data.batching" in library
    assert not library & {"pycocoevalcap", "nltk", "matplotlib", "gradio", "captioner.apps", "captioner.viz",
                          "captioner.training", "torchvision", "torch._dynamo", "torch.onnx"}
    assert not loaded_by("captioner.apps.commands.evaluate") & {"torch", "pycocoevalcap", "nltk", "matplotlib"}


# --- scripts -------------------------------------------------------------------------------------

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def run_script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return warm_start.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=600,
                          env=subprocess_env())


def test_results_table(tmp_path: Path) -> None:
    official = dict.fromkeys(OFFICIAL_KEYS, 0.5)
    report = {"images": 12, "beam_size": 3,
              "caption_stats": {"bad_ending_rate": 0.25, "repeated_bigram_rate": 0.0, "mean_length": 8.0}}
    write_scores_json(tmp_path / "a" / "scores_test.json", official, {}, extra=report)
    write_scores_json(tmp_path / "b" / "scores_val.json", {**official, "CIDEr": 0.75}, {}, extra=report)
    table = run_script("results_table.py", str(tmp_path / "a"))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith("| run | images | beam | Bleu_1")
    assert lines[2] == "| a | 12 | 3 | " + "0.500 | " * 7 + "25.0% | 0.0% | - |"
    assert "| b | 12 | 3 |" in run_script("results_table.py", "--split", "val", str(tmp_path / "b")).stdout
    missing = run_script("results_table.py", str(tmp_path / "a"), str(tmp_path / "b"))
    assert missing.returncode == 2 and missing.stdout == ""
    assert (missing.stderr.startswith("error: ") and "b/scores_test.json: no scores" in missing.stderr
            and missing.stderr.count("\n") == 1)


@pytest.fixture(scope="module")
def beam3_scores(tiny_checkpoint: Path):
    """The library's official evaluation of the tiny checkpoint's test split with beam 3: what
    compare_decoding's beam-3 rows must agree with (one Java start for both tests)."""
    from captioner.data.datasets import load_split
    from captioner.models.checkpoint import checkpoint_config, load_captioner

    model = load_captioner(tiny_checkpoint, "cpu")
    return evaluate(model, load_split(checkpoint_config(tiny_checkpoint).data, "test"), beam_size=3,
                    progress=False).scores


@pytest.mark.xdist_group("compare_decoding")  # the two share beam3_scores
@needs_java
def test_compare_decoding(tiny_checkpoint: Path, beam3_scores) -> None:
    result = run_script("compare_decoding.py", str(tiny_checkpoint), "--device", "cpu")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and not line.startswith("| decoding")]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == [
        "greedy", "greedy + trigram blocking", "beam 3", "beam 3 + trigram blocking",
        "diverse beam 3 (3 groups, lambda 0.5)"]
    # The beam-3 row is the library's evaluation with beam 3, to the table's three decimals.
    overall = beam3_scores.overall
    cells = rows[2].strip("| ").split(" | ")
    assert cells[1:6] == [f"{overall[k]:.3f}" for k in ("Bleu_1", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr")]


@pytest.mark.xdist_group("compare_decoding")
@needs_java
def test_compare_decoding_length_penalties_and_bleus_factors(tiny_checkpoint: Path, beam3_scores) -> None:
    result = run_script("compare_decoding.py", str(tiny_checkpoint), "--device", "cpu", "--length-penalties", "0,2",
                        "--json", str(tiny_checkpoint.parent / "alphas.json"))
    assert result.returncode == 0, result.stderr[-2000:]
    table = json.loads((tiny_checkpoint.parent / "alphas.json").read_text())
    assert [v["options"] for v in table["variants"]] == [{"beam_size": 3, "length_penalty": 0.0},
                                                         {"beam_size": 3, "length_penalty": 2.0}]
    assert all(set(v["overall"]) >= {"Bleu_1", "METEOR", "CIDEr"} and "bleu_parts" in v for v in table["variants"])
    rows = [line.strip("| ").split(" | ") for line in result.stdout.splitlines() if line.startswith("| beam")]
    assert [row[0] for row in rows] == ["beam 3, length penalty 0", "beam 3, length penalty 2"]
    bad = run_script("compare_decoding.py", str(tiny_checkpoint), "--length-penalties", "0,long")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--length-penalties" in bad.stderr
    # BLEU's factors multiply back to the official BLEU-1 and BLEU-4 of the same evaluation.
    scores = beam3_scores
    parts = scores.bleu_parts
    assert parts.brevity_penalty * parts.precisions[0] == pytest.approx(scores.overall["Bleu_1"], rel=1e-6, abs=1e-9)
    geometric = (parts.precisions[0] * parts.precisions[1] * parts.precisions[2] * parts.precisions[3]) ** 0.25
    assert parts.brevity_penalty * geometric == pytest.approx(scores.overall["Bleu_4"], rel=1e-4, abs=1e-9)
    assert parts.hypothesis_words == pytest.approx(scores.caption_stats["mean_length"] * len(scores.per_image))
