"""BLEU-1..4, ROUGE-L and CIDEr-D exactly as pycocoevalcap computes them, in a fraction of its time.

pycocoevalcap spends most of its time in per-n-gram Python and numpy-scalar work: it counts every
caption's n-grams twice (once for BLEU, once for CIDEr-D), takes `np.log` of each n-gram's document
frequency once per occurrence, and fills a dynamic-programming table for each ROUGE-L pair. Here
each caption's n-grams are counted once (`ngram_counts`, shared by BLEU and CIDEr-D), each distinct
n-gram's idf is computed once, and the longest common subsequence is a bit-parallel pass over one
caption. The formulas, their smoothing constants and the order of the floating-point operations
per image follow pycocoevalcap's, so the scores agree with it to about 1e-15 (tests/test_scorers.py
compares them on real COCO captions).

Every scorer takes captions already tokenised and joined by spaces, as pycocoevalcap's PTB
tokenizer returns them, and splits them the way pycocoevalcap's scorer does (BLEU and CIDEr-D on
whitespace, ROUGE-L on single spaces).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

MAX_N = 4  # BLEU-1..4 and CIDEr-D's n-grams up to 4
CIDER_SIGMA = 6.0  # CIDEr-D's length penalty, exp(-delta^2 / (2 sigma^2))
ROUGE_BETA = 1.2  # ROUGE-L's recall weight
# pycocoevalcap's BLEU smoothing: a precision with no match is 1e-15 / guesses, not 0.
_BLEU_TINY, _BLEU_SMALL = 1e-15, 1e-9

NgramCounts = Counter  # n-gram (a tuple of 1..4 words) -> count in one caption


@dataclass(frozen=True)
class CountedCaptions:
    """Each image's hypothesis and references with their 1- to 4-gram counts, computed once and
    shared by BLEU and CIDEr-D. Row i of each list is image i, in the order they were given."""

    hypotheses: list[NgramCounts]
    references: list[list[NgramCounts]]
    hypothesis_lengths: list[int]
    reference_lengths: list[list[int]]

    @classmethod
    def of(cls, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> CountedCaptions:
        hyp_words = [h.split() for h in hypotheses]
        ref_words = [[r.split() for r in refs] for refs in references]
        return cls(
            [ngram_counts(w) for w in hyp_words],
            [[ngram_counts(w) for w in refs] for refs in ref_words],
            [len(w) for w in hyp_words],
            [[len(w) for w in refs] for refs in ref_words],
        )


def ngram_counts(w: list[str]) -> NgramCounts:
    """The 1- to 4-grams of a caption's words (each a tuple, as pycocoevalcap keys them) and their
    counts, inserted in pycocoevalcap's order: all unigrams, then bigrams, and so on."""
    return Counter(chain(zip(w), zip(w, w[1:]), zip(w, w[1:], w[2:]), zip(w, w[1:], w[2:], w[3:])))


# --- BLEU ------------------------------------------------------------------------------------------


def bleu(counted: CountedCaptions) -> tuple[list[float], list[list[float]]]:
    """pycocoevalcap's `Bleu(4)`: corpus BLEU-1..4 (clipped matches and guesses summed over the
    corpus, brevity penalty from the reference length closest to each hypothesis, the shorter on a
    tie) and per-image BLEU-1..4 (`per_image[n - 1][i]`)."""
    correct_total, guess_total = [0] * MAX_N, [0] * MAX_N
    test_total = ref_total = 0
    per_image: list[list[float]] = [[] for _ in range(MAX_N)]
    for hyp, refs, test_len, ref_lens in zip(
        counted.hypotheses, counted.references, counted.hypothesis_lengths, counted.reference_lengths
    ):
        correct = [0] * MAX_N
        for gram, count in hyp.items():
            best = max(ref.get(gram, 0) for ref in refs)
            if best:
                correct[len(gram) - 1] += min(best, count)
        guess = [max(0, test_len - k) for k in range(MAX_N)]
        ref_len = min((abs(length - test_len), length) for length in ref_lens)[1]
        test_total += test_len
        ref_total += ref_len
        for k in range(MAX_N):
            correct_total[k] += correct[k]
            guess_total[k] += guess[k]
        for k, score in enumerate(_bleu_n(correct, guess, test_len, ref_len)):
            per_image[k].append(score)
    return _bleu_n(correct_total, guess_total, test_total, ref_total), per_image


def _bleu_n(correct: list[int], guess: list[int], test_len: int, ref_len: int) -> list[float]:
    """BLEU-1..4 from match counts, with pycocoevalcap's operations in its order."""
    scores = []
    product = 1.0
    for k in range(MAX_N):
        product *= (float(correct[k]) + _BLEU_TINY) / (float(guess[k]) + _BLEU_SMALL)
        scores.append(product ** (1.0 / (k + 1)))
    ratio = (test_len + _BLEU_TINY) / (ref_len + _BLEU_SMALL)
    if ratio < 1:
        penalty = math.exp(1 - 1 / ratio)
        scores = [score * penalty for score in scores]
    return scores


# --- CIDEr-D ---------------------------------------------------------------------------------------


def cider_d(counted: CountedCaptions) -> tuple[float, list[float]]:
    """pycocoevalcap's `Cider()` (CIDEr-D): tf-idf vectors of 1..4-grams with document frequencies
    over the references of the scored images, hypothesis weights clipped by each reference's, a
    Gaussian penalty on the length difference (sigma 6), averaged over n and references, times 10.
    Returns the corpus score (the mean) and each image's."""
    document_frequency: Counter = Counter()
    for refs in counted.references:
        document_frequency.update(set().union(*refs))
    # np.log as pycocoevalcap takes it (math.log may differ in the last bit); an n-gram that no
    # reference has counts as df 1, so its weight per occurrence is log_images.
    log_images = float(np.log(float(len(counted.references))))
    grams = list(document_frequency)
    log_df = np.log(np.maximum(1.0, np.array([document_frequency[g] for g in grams], dtype=np.float64)))
    idf = dict(zip(grams, (log_images - log_df).tolist()))

    scores = []
    for hyp, refs, test_len, ref_lens in zip(
        counted.hypotheses, counted.references, counted.hypothesis_lengths, counted.reference_lengths
    ):
        hyp_vec, hyp_norm = _tfidf(hyp, idf, log_images)
        hyp_bigrams = max(0, test_len - 1)  # pycocoevalcap's "length" is the bigram count
        total = [0.0] * MAX_N
        for ref, ref_len in zip(refs, ref_lens):
            ref_vec, ref_norm = _tfidf(ref, idf, log_images)
            delta = float(hyp_bigrams - max(0, ref_len - 1))
            penalty = math.e ** (-(delta**2) / (2 * CIDER_SIGMA**2))
            for n in range(MAX_N):
                ref_n = ref_vec[n]
                value = 0.0
                for gram, weight in hyp_vec[n].items():
                    ref_weight = ref_n.get(gram, 0.0)
                    value += min(weight, ref_weight) * ref_weight
                if hyp_norm[n] != 0 and ref_norm[n] != 0:
                    value /= hyp_norm[n] * ref_norm[n]
                total[n] += value * penalty
        scores.append(sum(total) / MAX_N / len(refs) * 10.0)
    return float(np.mean(np.array(scores))), scores


def _tfidf(counts: NgramCounts, idf: dict[tuple[str, ...], float], log_images: float) -> tuple[list[dict], list[float]]:
    """Per n: n-gram -> tf-idf weight, and the vector's Euclidean norm."""
    vec: list[dict] = [{} for _ in range(MAX_N)]
    squares = [0.0] * MAX_N
    for gram, tf in counts.items():
        n = len(gram) - 1
        weight = float(tf) * idf.get(gram, log_images)
        vec[n][gram] = weight
        squares[n] += weight**2
    return vec, [math.sqrt(s) for s in squares]


# --- ROUGE-L ---------------------------------------------------------------------------------------


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence of two token lists, bit-parallel over `a`
    (Allison-Dix / Hyyro): one pass over `b`, a few integer operations per token."""
    full = (1 << len(a)) - 1
    positions: dict[str, int] = {}
    for i, token in enumerate(a):
        positions[token] = positions.get(token, 0) | (1 << i)
    v = full
    for token in b:
        u = v & positions.get(token, 0)
        v = ((v + u) | (v - u)) & full
    return len(a) - v.bit_count()


def rouge_l(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> tuple[float, list[float]]:
    """pycocoevalcap's `Rouge()`: per image the F-measure (beta 1.2) of the best LCS precision and
    the best LCS recall over its references; the corpus score is their mean."""
    scores = []
    for hyp, refs in zip(hypotheses, references):
        hyp_tokens = hyp.split(" ")
        precision = recall = 0.0
        for ref in refs:
            ref_tokens = ref.split(" ")
            lcs = lcs_length(hyp_tokens, ref_tokens)
            precision = max(precision, lcs / float(len(hyp_tokens)))
            recall = max(recall, lcs / float(len(ref_tokens)))
        if precision != 0 and recall != 0:
            scores.append(((1 + ROUGE_BETA**2) * precision * recall) / float(recall + ROUGE_BETA**2 * precision))
        else:
            scores.append(0.0)
    return float(np.mean(np.array(scores))), scores
