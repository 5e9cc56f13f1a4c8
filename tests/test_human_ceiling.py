"""The pieces behind the Flickr8k table's diagnosis and its human row: BLEU taken apart into its
factors, the leave-one-out human ceiling, and the corpus statistics of captions."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pytest
from test_scorers import demo  # noqa: F401 - the COCO demo fixture, used by name

from captioner.core.errors import CaptionerError
from captioner.evaluation import scorers
from captioner.evaluation.caption_stats import corpus_stats, leave_one_out, unmatched_words
from captioner.evaluation.metrics import fast_scores


def test_bleu_parts_multiply_back_to_pycocoevalcaps_bleu(demo: tuple[dict[int, list[str]], dict[int, str]]) -> None:
    from pycocoevalcap.bleu.bleu import Bleu

    references, predictions = demo
    ids = sorted(predictions)
    refs = [[r.lower().rstrip(".") for r in references[i]] for i in ids]
    full = [predictions[i].lower().rstrip(".") for i in ids]
    for hyps in (full, [" ".join(h.split()[:6]) for h in full]):  # as they are (ratio 1.004), and cut short
        expected, _ = Bleu(4).compute_score({i: refs[n] for n, i in enumerate(ids)},
                                            {i: [hyps[n]] for n, i in enumerate(ids)}, verbose=0)
        parts = scorers.bleu_parts(scorers.CountedCaptions.of(hyps, refs))
        for n in range(4):
            geometric = math.prod(parts.precisions[: n + 1]) ** (1 / (n + 1))
            assert parts.brevity_penalty * geometric == pytest.approx(expected[n], rel=1e-9)
    assert parts.brevity_penalty < 0.7  # the cut captions are far shorter than their closest references
    assert parts.length_ratio == pytest.approx(parts.hypothesis_words / parts.reference_words)


def test_bleu_parts_no_penalty_for_long_captions_and_closest_reference_on_ties() -> None:
    counted = scorers.CountedCaptions.of(["a b c d e f"], [["a b c", "a b c d e f g h"]])
    parts = scorers.bleu_parts(counted)
    # 6 words: |3-6| = 3 and |8-6| = 2, so the closest reference has 8 words and the penalty applies
    assert parts.reference_words == 8 and parts.hypothesis_words == 6
    assert parts.brevity_penalty == pytest.approx(math.exp(1 - 8 / 6))
    assert parts.precisions[0] == 1.0
    longer = scorers.bleu_parts(scorers.CountedCaptions.of(["a b c d e f g h i"], [["a b c d e f g h"]]))
    assert longer.brevity_penalty == 1.0 and longer.precisions[0] == pytest.approx(8 / 9)
    tie = scorers.bleu_parts(scorers.CountedCaptions.of(["a b c d"], [["a b c", "a b c d e"]]))
    assert tie.reference_words == 3  # equally close: the shorter one, as pycocoevalcap picks


def recording_scorer(calls: list[tuple[dict[int, list[str]], dict[int, str]]], batches: list[int]):
    def score(jobs: Sequence[tuple[Mapping[int, list[str]], Mapping[int, str]]]) -> list[dict[str, float]]:
        batches.append(len(jobs))
        calls.extend((dict(references), dict(predictions)) for references, predictions in jobs)
        return [fast_scores(*job) for job in jobs]

    return score


def fast(jobs):
    return [fast_scores(*job) for job in jobs]


def test_leave_one_out_scores_each_reference_against_the_others_and_models_on_the_same_sets() -> None:
    references = {
        1: ["a dog runs on the grass", "a brown dog running on grass", "a dog in a field"],
        2: ["a man rides a bike", "a person on a bicycle", "a man cycling down a road"],
    }
    calls: list[tuple[dict[int, list[str]], dict[int, str]]] = []
    batches: list[int] = []
    result = leave_one_out(
        references, recording_scorer(calls, batches),
        {"model": {1: "a dog on the grass", 2: "a man on a bike", 3: "unused"}}
    )
    assert result.folds == 3
    assert batches == [6]  # one call (one Java start when official): per fold, the humans, then the model
    for k in range(3):
        (human_refs, human_hyps), (model_refs, model_hyps) = calls[2 * k], calls[2 * k + 1]
        assert human_refs == model_refs  # the same held-out references for both
        for i, refs in references.items():
            assert human_hyps[i] == refs[k] and refs[k] not in human_refs[i] and len(human_refs[i]) == 2
        assert model_hyps == {1: "a dog on the grass", 2: "a man on a bike"}
    folds = [{i: [c for j, c in enumerate(r) if j != k] for i, r in references.items()} for k in range(3)]
    human = sum(fast_scores(folds[k], {i: r[k] for i, r in references.items()})["CIDEr"] for k in range(3)) / 3
    model = sum(fast_scores(folds[k], {1: "a dog on the grass", 2: "a man on a bike"})["CIDEr"] for k in range(3)) / 3
    assert result.human["CIDEr"] == pytest.approx(human) and result.models["model"]["CIDEr"] == pytest.approx(model)
    assert human != pytest.approx(model) and set(result.models["model"]) == set(result.human)


def test_leave_one_out_refuses_images_it_cannot_score() -> None:
    with pytest.raises(CaptionerError, match="image 7 has 1 reference"):
        leave_one_out({1: ["a b", "c d"], 7: ["e f"]}, fast)
    with pytest.raises(CaptionerError, match="m has no caption for 1 image"):
        leave_one_out({1: ["a b", "c d"], 2: ["e f", "g h"]}, fast, {"m": {1: "a b"}})


def test_corpus_stats_counts_vocabulary_copies_length_and_distinct_captions() -> None:
    training = ["A dog runs on the grass.", "a man rides a bike"]
    stats = corpus_stats(
        ["a dog runs on the grass", "A man rides a bike .", "a dog runs on the grass", "two cats sleep"], training)
    assert stats["captions"] == 4
    assert stats["copied_share"] == 0.75  # case and punctuation do not make a caption new
    assert stats["vocabulary"] == len(
        {"a", "dog", "runs", "on", "the", "grass", "man", "rides", "bike", "two", "cats", "sleep"})
    assert stats["mean_length"] == (6 + 5 + 6 + 3) / 4
    assert stats["distinct_share"] == 3 / 4
    assert corpus_stats([], training)["captions"] == 0


def test_unmatched_words_clip_like_bleu_1() -> None:
    captions = {1: "a dog and a dog", 2: "a red car"}
    references = {1: ["a dog runs", "a dog and a cat"], 2: ["a blue car", "the car"]}
    used, unmatched = unmatched_words(captions, references)
    assert used == {"a": 3, "dog": 2, "and": 1, "red": 1, "car": 1}
    assert unmatched == {"a": 0, "dog": 1, "and": 0, "red": 1, "car": 0}  # two "a" allowed by one reference
    counted = scorers.CountedCaptions.of(list(captions.values()), list(references.values()))
    assert 1 - sum(unmatched.values()) / sum(used.values()) == pytest.approx(scorers.bleu_parts(counted).precisions[0])
