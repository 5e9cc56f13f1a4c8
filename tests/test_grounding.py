"""The grounding score: attention mass inside the named object's mask, beside the uniform baseline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from captioner.data.shapes import generate_shapes
from captioner.evaluation.grounding import (
    Instances,
    coco_regions,
    grounding_score,
    shapes_regions,
)
from captioner.core.decode_results import Caption


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Instances:
    root = tmp_path_factory.mktemp("ground")
    generate_shapes(root, num_train=0, num_val=0, num_test=30, image_size=64, seed=5, progress=False)
    return Instances(root / "instances_test.json")


def caption_with_maps(words: list[str], maps: torch.Tensor) -> Caption:
    attn = maps[:, None, None]  # (T, 1, 1, h, w)
    return Caption(" ".join(words), words, list(range(len(words))), 0.0, 0.0, attn, True)


def describe(instances: Instances, image_id: int) -> list[str]:
    objects = sorted(instances.objects(image_id), key=lambda o: o["bbox"][0])
    words = []
    for o in objects:
        words += ["a", o["size"], o["colour"], instances.category_names[o["category_id"]]]
    return words


def test_phrases_resolve_to_their_object() -> None:
    categories = {1: "circle", 2: "square"}
    objects = [{"id": 10, "colour": "red", "category_id": 1}, {"id": 11, "colour": "blue", "category_id": 2},
               {"id": 12, "colour": "red", "category_id": 2}]
    words = "a small red circle left of a large red square and a blue circle".split()
    regions = shapes_regions(words, objects, categories)
    assert {i: [o["id"] for o in objs] for i, objs in regions.items()} == {2: [10], 3: [10], 8: [12], 9: [12]}
    # "blue circle" names no object of this image: a wrong caption's words are not scored


def test_coco_synonyms() -> None:
    categories = {1: "person", 18: "dog"}
    objects = [{"id": 1, "category_id": 1}, {"id": 2, "category_id": 1}, {"id": 3, "category_id": 18}]
    regions = coco_regions("a man and a woman walk two puppies past a cat".split(), objects, categories)
    assert {i: len(v) for i, v in regions.items()} == {1: 2, 4: 2, 7: 1}  # "cat": no cat in the image


def oracle_captions(shapes: Instances) -> dict[int, Caption]:
    """A caption of every image whose colour and shape words attend exactly to their object's mask."""
    oracle = {}
    for image_id in shapes.coco.getImgIds():
        words = describe(shapes, image_id)
        h = w = 64  # maps at image resolution: an exact oracle
        exact = torch.zeros(len(words), h, w)
        objects = sorted(shapes.objects(image_id), key=lambda o: o["bbox"][0])
        for k, obj in enumerate(objects):
            mask = torch.from_numpy(shapes.mask(obj)).float()
            exact[4 * k + 2] = exact[4 * k + 3] = mask / mask.sum()
        oracle[image_id] = caption_with_maps(words, exact)
    return oracle


def test_attention_on_the_object_scores_one_and_uniform_scores_the_baseline(shapes: Instances) -> None:
    oracle = oracle_captions(shapes)
    uniform = {}
    for image_id in shapes.coco.getImgIds():
        words = describe(shapes, image_id)
        uniform[image_id] = caption_with_maps(words, torch.full((len(words), 4, 4), 1 / 16))
    good, flat = grounding_score(oracle, shapes), grounding_score(uniform, shapes)
    assert good.words == flat.words > 30
    assert good.score == pytest.approx(1.0, abs=0.02)
    assert flat.score == pytest.approx(flat.baseline, rel=0.05)
    assert 0.005 < flat.baseline < 0.2 and good.ratio > 5
    from captioner.data.shapes import COLOURS, SHAPES

    assert set(good.to_json()["per_word"]) <= set(COLOURS) | set(SHAPES)  # sizes and articles are not scored


def test_attention_elsewhere_scores_below_the_baseline(shapes: Instances) -> None:
    wrong = {}
    for image_id in shapes.coco.getImgIds():
        words = describe(shapes, image_id)
        union = np.logical_or.reduce([shapes.mask(o) for o in shapes.objects(image_id)])
        outside = torch.from_numpy(~union).float()
        wrong[image_id] = caption_with_maps(words, (outside / outside.sum()).expand(len(words), -1, -1))
    assert grounding_score(wrong, shapes).score < 0.01


def test_bad_instances_file(tmp_path: Path) -> None:
    from captioner.core.errors import DatasetError

    with pytest.raises(DatasetError, match="instances file not found"):
        Instances(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DatasetError, match="not a COCO instances file"):
        Instances(tmp_path / "bad.json")


def test_ambiguous_coco_words_are_not_scored_and_phrases_are() -> None:
    categories = {1: "person", 13: "stop sign", 10: "traffic light", 18: "dog", 58: "hot dog", 55: "orange",
                  46: "wine glass", 42: "surfboard", 31: "handbag", 23: "bear", 88: "teddy bear"}
    objects = [{"id": i, "category_id": c} for i, c in enumerate(categories)]
    words = ("an orange sign by a stop sign under a light and a traffic light , a man with glasses and wine "
             "on a board with a bag eats a hot dog next to a teddy bear and a wine glass of oranges").split()
    regions = coco_regions(words, objects, categories)
    named = {words[i]: categories[objs[0]["category_id"]] for i, objs in regions.items()}
    assert named == {"sign": "stop sign", "light": "traffic light", "man": "person", "dog": "hot dog",
                     "bear": "teddy bear", "glass": "wine glass", "oranges": "orange"}
    scored = sorted(regions)
    assert [words[i - 1] for i in scored if words[i] in ("sign", "light", "dog", "bear", "glass")] == [
        "stop", "traffic", "hot", "teddy", "wine"]  # only inside their phrases


def test_grounding_is_reported_per_category(shapes: Instances) -> None:
    """Each category's score is its words' mean; the words add up to the overall count."""
    captions = {}
    for image_id in shapes.coco.getImgIds():
        words = describe(shapes, image_id)
        captions[image_id] = caption_with_maps(words, torch.full((len(words), 4, 4), 1 / 16))
    report = grounding_score(captions, shapes).to_json()
    per_category = report["per_category"]
    assert set(per_category) <= set(shapes.category_names.values()) and len(per_category) >= 2
    assert sum(c["words"] for c in per_category.values()) == report["words"]
    weighted = sum(c["score"] * c["words"] for c in per_category.values()) / report["words"]
    assert weighted == pytest.approx(report["score"], abs=1e-3)
    for c in per_category.values():  # uniform maps: each category scores its own baseline
        assert c["score"] == pytest.approx(c["uniform_baseline"], rel=0.1) and c["ratio"] == pytest.approx(1.0, abs=0.1)


def test_score_grounding_reports_the_attention_and_every_map_kind(shapes: Instances) -> None:
    """The library's grounding step (what `captioner evaluate --grounding` reports): the requested
    maps' score, and grounding and pointing of every map kind over the same words."""
    from captioner.evaluation.evaluate import GroundingRequest, score_grounding
    from helpers import tiny_model

    oracle = oracle_captions(shapes)
    grounding = score_grounding(tiny_model(), [], oracle, GroundingRequest(shapes, "shapes"))
    report = grounding.to_json()
    assert report["instances"] == str(shapes.path) and report["layer"] == -1 and report["head"] == "mean"
    assert report["words"] == report["per_head"]["words"] > 30
    assert report["score"] == pytest.approx(1.0, abs=0.02) and report["ratio"] > 5
    assert set(report["per_head"]["maps"]) == {"L0H0"}  # one map a word: no mean, no Grad-CAM unless asked
    exact = report["per_head"]["maps"]["L0H0"]
    assert exact["grounding"] == pytest.approx(1.0, abs=0.02) and exact["pointing"] == 1.0
    baselines = report["per_head"]["baselines"]
    assert baselines["uniform_grounding"] == report["uniform_baseline"] < baselines["random_point"] < 1.0
