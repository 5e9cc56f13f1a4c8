"""The n-gram core (in captioner/evaluation/scorers.py) that the scorers and both SCST rewards build on:
each rule checked alone against pycocoevalcap or a hand computation, on cases built so that a wrong
rule (no clipping, another sigma, df counted per reference) gives another number."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import require_module

from captioner.evaluation import scorers
from captioner.evaluation.scorers import (
    bleu_clip,
    bleu_guesses,
    bleu_scores,
    cider_clip,
    cider_length,
    cider_length_penalty,
    clipped_matches,
    closest_ref_length,
    document_frequency,
    idf_table,
    inverse_document_frequency,
    log_images,
    max_reference_counts,
    ngram_counts,
)

require_module("pycocoevalcap", "the core is compared with pycocoevalcap (pip install -e .[train])")
from pycocoevalcap.bleu.bleu import Bleu  # noqa: E402
from pycocoevalcap.cider import cider_scorer  # noqa: E402
from pycocoevalcap.cider.cider import Cider  # noqa: E402

# Crafted so that every rule matters: "a dog a dog a dog" repeats n-grams past any reference's
# count (clipping), lengths differ by up to 8 bigrams (the penalty), "a dog" is in every image's
# references (df > 1, but not every image's: idf > 0) and "red" in none.
IMAGES = {
    0: ("a dog a dog a dog", ["a dog runs on the grass", "a brown dog on grass", "the dog is running"]),
    1: ("a red cat sits", ["a cat sits on a mat", "a small cat is sitting on a red mat with a dog"]),
    2: ("a dog", ["a dog and a man walk along the road next to a river", "a man and a dog"]),
    3: ("two birds fly", ["two birds fly over the sea", "birds flying over water"]),
    4: ("a man on a bike", ["a man rides a bike down a street", "a person riding a bicycle"]),
    5: ("a plate of food", ["a plate of food on a table", "food on a white plate"]),
}


def test_ngram_counts_are_pycocoevalcap_precook_in_its_order() -> None:
    for words in ("", "a", "a dog a dog a dog", "a man riding a wave on top of a surfboard"):
        for n in (1, 2, 4, 5):
            got = ngram_counts(words.split(), n)
            want = cider_scorer.precook(words, n)
            assert dict(got) == dict(want), (words, n)
            assert list(got) == list(want), (words, n)  # insertion order: all unigrams, then bigrams, ...
    assert ngram_counts((1, 2, 1, 2))[(1, 2)] == 2  # any hashable tokens, tuples too


def test_document_frequency_counts_each_image_once() -> None:
    refs = [[ngram_counts(r.split()) for r in rs] for _, rs in IMAGES.values()]
    scorer = cider_scorer.CiderScorer(n=4, sigma=6.0)
    for hyp, rs in IMAGES.values():
        scorer += (hyp, rs)
    scorer.compute_doc_freq()
    assert document_frequency(refs) == scorer.document_frequency
    assert document_frequency(refs)[("a", "dog")] == 3  # twice in image 2's references, counted once there
    assert document_frequency(refs)[("cat",)] == 1


def test_idf_is_log_images_minus_log_df_for_floats_arrays_and_tensors() -> None:
    df = np.array([0.0, 1.0, 2.0, 7.0])  # 0: an n-gram no reference holds counts as held once
    want = np.log(7.0) - np.log(np.array([1.0, 1.0, 2.0, 7.0]))
    assert log_images(7) == np.log(7.0)
    assert np.array_equal(inverse_document_frequency(df, log_images(7)), want)
    assert torch.allclose(inverse_document_frequency(torch.from_numpy(df), log_images(7)), torch.from_numpy(want),
                          rtol=0, atol=1e-15)
    assert idf_table({("a",): 7, ("b",): 2}, 7) == {("a",): 0.0, ("b",): float(want[2])}


def test_cider_clip_and_length_penalty_are_pycocoevalcaps() -> None:
    for h, r in ((2.0, 1.0), (1.0, 2.0), (0.5, 0.5)):
        want = min(h, r) * r  # pycocoevalcap's val[n] += min(vec_hyp, vec_ref) * vec_ref
        assert cider_clip(h, r) == want
        assert cider_clip(np.array([h]), np.array([r]))[0] == want
        assert float(
            cider_clip(torch.tensor([h], dtype=torch.float64), torch.tensor([r], dtype=torch.float64))[0]) == want
    assert cider_clip(2.0, 1.0) == 1.0  # twice the reference's weight earns the reference's
    assert scorers.CIDER_SIGMA == 6.0
    for delta in range(-12, 13):
        assert cider_length_penalty(float(delta)) == np.e ** (-(float(delta) ** 2) / (2 * 6.0**2))
    assert cider_length_penalty(6.0) == pytest.approx(math.exp(-0.5), abs=1e-15)  # one sigma away
    assert [cider_length(w) for w in (0, 1, 2, 9)] == [0, 0, 1, 8]  # pycocoevalcap's "length": bigrams
    assert cider_length(torch.tensor([0, 1, 9])).tolist() == [0, 0, 8]
    assert cider_length(np.array([0, 1, 9])).tolist() == [0, 0, 8]


def cider_from_the_core(images: dict, clip: bool = True, sigma: float = 6.0) -> list[float]:
    """CIDEr-D written out from the core's rules alone, the corpus being the scored images."""
    refs = {i: [ngram_counts(r.split()) for r in rs] for i, (_, rs) in images.items()}
    idf, unseen = idf_table(document_frequency(refs.values()), len(images)), log_images(len(images))

    def vector(counts):
        weights = [{g: tf * idf.get(g, unseen) for g, tf in counts.items() if len(g) == k} for k in range(1, 5)]
        return weights, [math.sqrt(sum(v * v for v in w.values())) for w in weights]

    scores = []
    for i, (hyp, rs) in images.items():
        (hw, hn), total = vector(ngram_counts(hyp.split())), 0.0
        for ref_words, ref in zip(rs, refs[i]):
            rw, rn = vector(ref)
            delta = float(cider_length(len(hyp.split())) - cider_length(len(ref_words.split())))
            for k in range(4):
                value = sum((cider_clip(h, rw[k][g]) if clip else h * rw[k][g]) for g, h in hw[k].items() if g in rw[k])
                if hn[k] != 0 and rn[k] != 0:
                    value /= hn[k] * rn[k]
                total += value * cider_length_penalty(delta, sigma)
        scores.append(total / 4 / len(rs) * scorers.CIDER_SCALE)
    return scores


def test_cider_d_from_the_core_equals_pycocoevalcap_and_each_rule_matters() -> None:
    gts = {i: rs for i, (_, rs) in IMAGES.items()}
    res = {i: [hyp] for i, (hyp, _) in IMAGES.items()}
    want = Cider().compute_score(gts, res)[1]
    assert want[0] > 0.1 and want.max() > 1.0
    assert np.abs(np.array(cider_from_the_core(IMAGES)) - want).max() < 1e-12
    assert np.abs(np.array(cider_from_the_core(IMAGES, clip=False)) - want).max() > 1e-3  # clipping is in play
    assert np.abs(np.array(cider_from_the_core(IMAGES, sigma=5.0)) - want).max() > 1e-3  # and so is sigma 6


def test_bleu_clipped_precisions_by_hand() -> None:
    """Papineni et al.'s example: seven "the" against references holding at most two."""
    refs = [ngram_counts("the cat is on the mat".split()), ngram_counts("there is a cat on the mat".split())]
    maxima = max_reference_counts(refs)
    assert maxima[("the",)] == 2 and maxima[("on", "the", "mat")] == 1
    assert clipped_matches(ngram_counts(["the"] * 7), maxima) == [2, 0, 0, 0]  # 2/7, not 7/7
    assert bleu_clip(7, 2) == 2 and bleu_clip(1, 2) == 1
    assert bleu_clip(np.array([7, 1]), np.array([2, 2])).tolist() == [2, 1]
    hyp = "the cat sat on the mat".split()
    correct = clipped_matches(ngram_counts(hyp), maxima)
    assert correct == [5, 3, 1, 0]  # the x2, cat, on, mat | the cat, on the, the mat | on the mat
    assert bleu_guesses(len(hyp)) == [6, 5, 4, 3]
    assert closest_ref_length(6, [6, 7]) == 6 and closest_ref_length(5, [4, 6]) == 4  # the shorter on a tie
    scores = bleu_scores(correct, bleu_guesses(6), 6, 6)
    assert scores[0] == pytest.approx(5 / 6, abs=1e-9)  # 1e-9: pycocoevalcap's smoothing of the guesses
    assert scores[1] == pytest.approx(math.sqrt(5 / 6 * 3 / 5), abs=1e-9)
    assert scores[2] == pytest.approx((5 / 6 * 3 / 5 * 1 / 4) ** (1 / 3), abs=1e-9)
    assert scores[3] < 1e-3  # no 4-gram matches: pycocoevalcap's 1e-15 smoothing, not 0
    short = bleu_scores(clipped_matches(ngram_counts(["the", "cat"]), maxima), bleu_guesses(2), 2, 6)
    assert short[1] == pytest.approx(math.exp(1 - 6 / 2), abs=1e-9)  # precisions 1: only the brevity penalty


def test_bleu_from_the_core_equals_pycocoevalcap() -> None:
    gts = {i: rs for i, (_, rs) in IMAGES.items()}
    res = {i: [hyp] for i, (hyp, _) in IMAGES.items()}
    corpus_want, per_image_want = Bleu(4).compute_score(gts, res, verbose=0)
    totals = [[0] * 4, [0] * 4, 0, 0]
    for i, (hyp, rs) in IMAGES.items():
        words = hyp.split()
        parts = (
            clipped_matches(ngram_counts(words), max_reference_counts(ngram_counts(r.split()) for r in rs)),
            bleu_guesses(len(words)),
            len(words),
            closest_ref_length(len(words), [len(r.split()) for r in rs]),
        )
        assert bleu_scores(*parts) == [per_image_want[k][i] for k in range(4)]
        totals = [[a + b for a, b in zip(totals[0], parts[0])], [a + b for a, b in zip(totals[1], parts[1])],
                  totals[2] + parts[2], totals[3] + parts[3]]
    assert bleu_scores(*totals) == corpus_want


def test_the_three_roles_agree_on_the_crafted_images() -> None:
    """The evaluation's scorer, the host reward and the device reward, all on the core: one CIDEr-D."""
    from captioner.evaluation.scorers import CountedCaptions, cider_d
    from captioner.training.device_reward import ReferenceTable, padded
    from captioner.training.host_reward import CiderD

    hyps = [hyp for hyp, _ in IMAGES.values()]
    refs = [rs for _, rs in IMAGES.values()]
    evaluation = cider_d(CountedCaptions.of(hyps, refs))[1]
    vocab = {w: i for i, w in enumerate(sorted({w for text in [*hyps, *sum(refs, [])] for w in text.split()}))}
    ids = lambda text: [vocab[w] for w in text.split()]  # noqa: E731
    corpus = [[ids(r) for r in rs] for rs in refs]
    host = CiderD(corpus)
    for key, rs in enumerate(corpus):
        host.add_references(key, rs)
    host_scores = host.score([ids(h) for h in hyps], range(len(hyps)))
    device_scores = ReferenceTable.build(corpus).score(*padded([ids(h) for h in hyps]), torch.arange(len(hyps)))
    assert np.abs(host_scores - evaluation).max() < 1e-12
    assert np.abs(device_scores.numpy() - evaluation).max() < 1e-12
    assert np.abs(np.array(evaluation) - np.array(cider_from_the_core(IMAGES))).max() < 1e-12
