"""The n-gram core of BLEU and CIDEr-D as pycocoevalcap defines them, shared by the scorers and both
SCST rewards. What the vectorised scorers call takes a float, a numpy array or a torch tensor alike,
with pycocoevalcap's operations in its order, so every caller gets its numbers."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from itertools import chain
from typing import TypeVar

import numpy as np

MAX_N = 4  # BLEU-1..4 and CIDEr-D's n-grams up to 4
CIDER_SIGMA = 6.0  # CIDEr-D's length penalty, exp(-delta^2 / (2 sigma^2))
CIDER_SCALE = 10.0  # CIDEr-D's mean over orders and references, times 10
# pycocoevalcap's BLEU smoothing: a precision with no match is 1e-15 / guesses, not 0.
BLEU_TINY, BLEU_SMALL = 1e-15, 1e-9

NGram = tuple[Hashable, ...]
NgramCounts = Counter  # n-gram (a tuple of 1..n tokens) -> count in one caption
Number = TypeVar("Number")  # a float, a numpy array or a torch tensor
Key = TypeVar("Key", bound=Hashable)  # an n-gram, or a word where only unigrams are counted


def ngram_counts(tokens: Sequence[Hashable], n: int = MAX_N) -> NgramCounts:
    """The 1- to n-grams of a caption's tokens (each a tuple, as pycocoevalcap keys them) and their
    counts, inserted in pycocoevalcap's order: all unigrams, then bigrams, and so on."""
    w = tokens
    if n == MAX_N:  # the same, unrolled: the scorers count millions of captions
        return Counter(chain(zip(w), zip(w, w[1:]), zip(w, w[1:], w[2:]), zip(w, w[1:], w[2:], w[3:])))
    shifted = [w[k:] for k in range(n)]  # zip stops at the shortest, so no k-gram runs past the end
    return Counter(chain(*[zip(*shifted[:k]) for k in range(1, n + 1)]))


def document_frequency(images: Iterable[Iterable[NgramCounts]]) -> Counter:
    """Per n-gram, the number of images whose references (their `ngram_counts`) hold it."""
    df: Counter = Counter()
    for refs in images:
        df.update(set().union(*refs))
    return df


def inverse_document_frequency(df: Number, log_num_images: float) -> Number:
    """CIDEr-D's idf, log(images) - log(max(1, df)): an n-gram that no reference holds counts as
    held once. `df` is a numpy array (np.log, as pycocoevalcap takes it) or a torch tensor."""
    return (log_num_images - df.clip(min=1.0).log() if hasattr(df, "log")
            else log_num_images - np.log(np.maximum(1.0, df)))


def log_images(num_images: int) -> float:
    """log(number of images), the idf's numerator, as pycocoevalcap takes it (np.log)."""
    return float(np.log(float(num_images)))


def idf_table(df: Mapping[NGram, int], num_images: int) -> dict[NGram, float]:
    """Every n-gram of `df` -> its idf; an n-gram missing from it has idf `log_images(num_images)`."""
    grams = list(df)
    counts = np.array([df[g] for g in grams], dtype=np.float64)
    return dict(zip(grams, inverse_document_frequency(counts, log_images(num_images)).tolist()))


def cider_clip(hyp_weight: Number, ref_weight: Number) -> Number:
    """CIDEr-D's min(h, r) * r of a hypothesis and a reference n-gram's tf-idf weights (no gain past r)."""
    lower = min(hyp_weight, ref_weight) if isinstance(hyp_weight, float) else hyp_weight.clip(max=ref_weight)
    return lower * ref_weight


def cider_length(num_words: Number) -> Number:
    """The "length" of CIDEr-D's penalty as pycocoevalcap counts it: the bigrams, max(words - 1, 0)."""
    return max(num_words - 1, 0) if isinstance(num_words, int) else (num_words - 1).clip(min=0)


def cider_length_penalty(delta: Number, sigma: float = CIDER_SIGMA) -> Number:
    """exp(-delta^2 / (2 sigma^2)) of two captions' `cider_length` difference, as pycocoevalcap writes it."""
    return math.e ** (-(delta**2) / (2 * sigma**2))


def bleu_clip(hyp_count: Number, max_ref_count: Number) -> Number:
    """BLEU's clipped count min(c, m) of an n-gram: c its hypothesis count, m its `max_reference_counts`."""
    return min(hyp_count, max_ref_count) if isinstance(hyp_count, int) else hyp_count.clip(max=max_ref_count)


def max_reference_counts(refs: Iterable[Mapping[Key, int]]) -> dict[Key, int]:
    """Per n-gram, the most any one reference has of it: the cap on a hypothesis's matches."""
    maxima: dict[Key, int] = {}
    for counts in refs:
        for gram, count in counts.items():
            if count > maxima.get(gram, 0):
                maxima[gram] = count
    return maxima


def clipped_matches(hyp: NgramCounts, maxima: Mapping[NGram, int], n: int = MAX_N) -> list[int]:
    """BLEU's clipped matches for orders 1..n, each n-gram's count clipped by `bleu_clip`."""
    correct = [0] * n
    for gram, count in hyp.items():
        correct[len(gram) - 1] += bleu_clip(count, maxima.get(gram, 0))
    return correct


def bleu_guesses(test_len: int, n: int = MAX_N) -> list[int]:
    """How many k-grams a hypothesis of `test_len` words offers, k = 1..n: BLEU's denominators."""
    return [max(0, test_len - k) for k in range(n)]


def closest_ref_length(test_len: int, ref_lens: Sequence[int]) -> int:
    """The reference length closest to the hypothesis's, the shorter on a tie (pycocoevalcap's 'closest')."""
    return min((abs(length - test_len), length) for length in ref_lens)[1]


def bleu_scores(correct: Sequence[int], guess: Sequence[int], test_len: int, ref_len: int) -> list[float]:
    """BLEU-1..n from clipped matches and guesses (of one caption, or summed over a corpus), with
    pycocoevalcap's smoothing and brevity penalty, its operations in its order."""
    scores = []
    product = 1.0
    for k in range(len(correct)):
        product *= (float(correct[k]) + BLEU_TINY) / (float(guess[k]) + BLEU_SMALL)
        scores.append(product ** (1.0 / (k + 1)))
    ratio = (test_len + BLEU_TINY) / (ref_len + BLEU_SMALL)
    if ratio < 1:
        penalty = math.exp(1 - 1 / ratio)
        scores = [score * penalty for score in scores]
    return scores
