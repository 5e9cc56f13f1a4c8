"""BLEU-1..4, ROUGE-L and CIDEr-D exactly as pycocoevalcap computes them, in a fraction of its time.
Its floating-point operations in its order (agreeing to about 1e-15), with n-grams counted once, each
idf once and LCS bit-parallel, on captions PTB-tokenised and space-joined. The n-gram core of BLEU and
CIDEr-D (counts, document frequencies, clipping, the length penalty) is shared with both SCST rewards:
what the vectorised scorers call takes a float, a numpy array or a torch tensor alike, with
pycocoevalcap's operations in its order, so every caller gets its numbers."""

from __future__ import annotations

import contextlib
import gc
import math
import operator
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, repeat
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
    counts = np.fromiter(df.values(), dtype=np.float64, count=len(df))
    return dict(zip(df, inverse_document_frequency(counts, log_images(num_images)).tolist()))


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
    precisions = [(float(c) + BLEU_TINY) / (float(g) + BLEU_SMALL) for c, g in zip(correct, guess)]
    ratio = (test_len + BLEU_TINY) / (ref_len + BLEU_SMALL)
    penalty = math.exp(1 - 1 / ratio) if ratio < 1 else 1.0  # the brevity penalty
    # BLEU-n: the n-th root of the product of the first n precisions
    return [product ** (1.0 / n) * penalty for n, product in enumerate(accumulate(precisions, operator.mul), start=1)]


ROUGE_BETA = 1.2  # ROUGE-L's recall weight


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector: counting creates millions of tuples and dicts, none
    of them garbage, which it would otherwise rescan again and again (about 15% of the time)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True)
class CountedCaptions:
    """The n-gram statistics BLEU and CIDEr-D share, as flat arrays in image order: "hyp" rows are
    hypothesis n-grams (pycocoevalcap's order), "pair" rows (image, reference) pairs, "match" rows a
    hypothesis n-gram of one pair with the reference's count, "ref" rows the references' n-grams."""

    num_images: int
    hyp_lengths: list[int]  # words per hypothesis
    ref_lengths: list[list[int]]  # words per reference
    hyp_grams: list[tuple[str, ...]]
    hyp_tf: np.ndarray  # (hyp,) float64
    hyp_order: np.ndarray  # (hyp,) n - 1
    hyp_image: np.ndarray  # (hyp,)
    pair_image: np.ndarray  # (pair,)
    pair_ref_length: np.ndarray  # (pair,)
    match_hyp: np.ndarray  # (match,) row of hyp
    match_pair: np.ndarray  # (match,)
    match_ref_tf: np.ndarray  # (match,) float64, 0 where the reference lacks the n-gram
    ref_grams: list[tuple[str, ...]]
    ref_tf: np.ndarray  # (ref,) float64
    ref_order: np.ndarray  # (ref,) n - 1
    ref_pair: np.ndarray  # (ref,)
    document_frequency: Counter  # n-gram -> number of images whose references have it

    @classmethod
    @_collector_paused()
    def of(cls, hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> CountedCaptions:
        """Count space-joined hypotheses and their references (hypotheses[i]: image i's)."""
        hyp_words = [h.split() for h in hypotheses]
        hyp_counts = [ngram_counts(w) for w in hyp_words]
        ref_words = [[r.split() for r in refs] for refs in references]
        ref_counts = [[ngram_counts(w) for w in refs] for refs in ref_words]
        match_ref_tf: list[int] = []
        for hyp, refs in zip(hyp_counts, ref_counts):
            grams = list(hyp)
            for ref in refs:  # the reference's count of each hypothesis n-gram, in C (dict.get via map)
                match_ref_tf += map(ref.get, grams, repeat(0))
        flat_refs = [ref for refs in ref_counts for ref in refs]
        hyp_grams = list(chain.from_iterable(hyp_counts))
        ref_grams = list(chain.from_iterable(flat_refs))
        hyp_sizes = np.array([len(c) for c in hyp_counts], dtype=np.int64)
        refs_per_image = np.array([len(refs) for refs in ref_counts], dtype=np.int64)
        pair_image = np.repeat(np.arange(len(hyp_counts)), refs_per_image)  # (pair,)
        pair_sizes = hyp_sizes[pair_image]  # hypothesis n-grams per pair
        match_pair = np.repeat(np.arange(len(pair_image)), pair_sizes)  # (match,)
        hyp_start = np.cumsum(hyp_sizes) - hyp_sizes
        match_start = np.cumsum(pair_sizes) - pair_sizes
        match_hyp = hyp_start[pair_image][match_pair] + np.arange(len(match_pair)) - match_start[match_pair]
        return cls(
            num_images=len(hyp_counts),
            hyp_lengths=[len(w) for w in hyp_words],
            ref_lengths=[[len(w) for w in refs] for refs in ref_words],
            hyp_grams=hyp_grams,
            hyp_tf=np.fromiter(chain.from_iterable(c.values() for c in hyp_counts), np.float64, len(hyp_grams)),
            hyp_order=np.fromiter(map(len, hyp_grams), np.int64, len(hyp_grams)) - 1,
            hyp_image=np.repeat(np.arange(len(hyp_counts)), hyp_sizes),
            pair_image=pair_image,
            pair_ref_length=np.array([len(words) for refs in ref_words for words in refs], dtype=np.int64),
            match_hyp=match_hyp,
            match_pair=match_pair,
            match_ref_tf=np.array(match_ref_tf, dtype=np.float64),
            ref_grams=ref_grams,
            ref_tf=np.fromiter(chain.from_iterable(c.values() for c in flat_refs), np.float64, len(ref_grams)),
            ref_order=np.fromiter(map(len, ref_grams), np.int64, len(ref_grams)) - 1,
            ref_pair=np.repeat(np.arange(len(flat_refs)), [len(c) for c in flat_refs]),
            document_frequency=document_frequency(ref_counts),
        )


def _sums(index: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Per index, the sum of its values added one by one in array order (np.bincount's loop), so
    each sum is formed in the order pycocoevalcap's Python loop forms it."""
    return np.bincount(index, weights=values, minlength=size)


def bleu(counted: CountedCaptions) -> tuple[list[float], list[list[float]]]:
    """pycocoevalcap's `Bleu(4)`: corpus BLEU-1..4 (matches and guesses summed over the corpus, the
    closest reference length for the penalty) and per-image BLEU-1..4 (`per_image[n - 1][i]`)."""
    images = list(_bleu_counts(counted))
    per_image = [list(scores) for scores in zip(*(bleu_scores(*image) for image in images))]  # (4, images)
    return bleu_scores(*_summed(images)), per_image


def _bleu_counts(counted: CountedCaptions) -> Iterator[tuple[list[int], list[int], int, int]]:
    """Per image: clipped matches and guesses for n = 1..4, its length, and the closest reference's. An
    n-gram matches at most as often as the one reference that has it most often."""
    best = np.zeros(len(counted.hyp_tf))  # (hyp,) the most any one reference has of the n-gram
    np.maximum.at(best, counted.match_hyp, counted.match_ref_tf)
    clipped = bleu_clip(counted.hyp_tf, best)
    correct = _sums(counted.hyp_image * MAX_N + counted.hyp_order, clipped, counted.num_images * MAX_N)
    matches = correct.reshape(counted.num_images, MAX_N).astype(np.int64).tolist()  # (images, 4), whole numbers
    for correct_n, test_len, ref_lens in zip(matches, counted.hyp_lengths, counted.ref_lengths):
        yield correct_n, bleu_guesses(test_len), test_len, closest_ref_length(test_len, ref_lens)


def _summed(images: Iterable[tuple[list[int], list[int], int, int]]) -> tuple[list[int], list[int], int, int]:
    """The corpus counts: every image's matches, guesses and lengths summed (integers, so in any order)."""
    correct, guess, test_lens, ref_lens = zip(*images)  # per image, each of the four
    return [sum(c) for c in zip(*correct)], [sum(g) for g in zip(*guess)], sum(test_lens), sum(ref_lens)


@dataclass(frozen=True)
class BleuParts:
    """Corpus BLEU taken apart, BLEU-n = brevity_penalty * (p_1 ... p_n) ** (1 / n): says whether
    captions are too short (`length_ratio` < 1) or have wrong words (a low `precisions[0]`)."""

    precisions: tuple[float, ...]  # clipped n-gram precision for n = 1..4
    hypothesis_words: int
    reference_words: int  # the closest reference length, summed over the images
    length_ratio: float  # hypothesis_words / reference_words
    brevity_penalty: float  # exp(1 - 1 / ratio) below 1, else 1


def bleu_parts(counted: CountedCaptions) -> BleuParts:
    """The factors of pycocoevalcap's corpus BLEU (see `bleu`), from the same corpus counts."""
    correct_total, guess_total, test_total, ref_total = _summed(_bleu_counts(counted))
    precisions = tuple(c / g if g else 0.0 for c, g in zip(correct_total, guess_total))
    ratio = test_total / ref_total if ref_total else 0.0
    penalty = math.exp(1 - 1 / ratio) if 0 < ratio < 1 else (1.0 if ratio >= 1 else 0.0)
    return BleuParts(precisions, test_total, ref_total, ratio, penalty)


def cider_d(counted: CountedCaptions) -> tuple[float, list[float]]:
    """pycocoevalcap's `Cider()` (CIDEr-D): the corpus score (the mean) and each image's, vectorised
    over all (image, reference) pairs with every sum in pycocoevalcap's order, so the same doubles."""
    # An n-gram that no reference has counts as df 1: its idf is log(images).
    idf_of, unseen = idf_table(counted.document_frequency, counted.num_images), log_images(counted.num_images)
    hyp_idf = np.fromiter(map(idf_of.get, counted.hyp_grams, repeat(unseen)), np.float64, len(counted.hyp_grams))
    ref_idf = np.fromiter(map(idf_of.get, counted.ref_grams, repeat(unseen)), np.float64, len(counted.ref_grams))

    num_pairs = len(counted.pair_image)
    hyp_weight = counted.hyp_tf * hyp_idf  # (hyp,) tf-idf
    ref_weight = counted.ref_tf * ref_idf  # (ref,)
    hyp_norm = np.sqrt(_sums(counted.hyp_image * MAX_N + counted.hyp_order, hyp_weight**2, counted.num_images * MAX_N))
    ref_norm = np.sqrt(_sums(counted.ref_pair * MAX_N + counted.ref_order, ref_weight**2, num_pairs * MAX_N))
    hyp_norm = hyp_norm.reshape(-1, MAX_N)[counted.pair_image]  # (pair, 4)
    ref_norm = ref_norm.reshape(-1, MAX_N)  # (pair, 4)

    # Per pair and n: the sum over hypothesis n-grams of min(hyp weight, ref weight) * ref weight.
    match_hyp_weight = hyp_weight[counted.match_hyp]  # (match,)
    match_ref_weight = counted.match_ref_tf * hyp_idf[counted.match_hyp]  # (match,)
    terms = cider_clip(match_hyp_weight, match_ref_weight)
    match_order = counted.hyp_order[counted.match_hyp]
    value = _sums(counted.match_pair * MAX_N + match_order, terms, num_pairs * MAX_N).reshape(num_pairs, MAX_N)
    both = (hyp_norm != 0) & (ref_norm != 0)
    value = np.where(both, value / np.where(both, hyp_norm * ref_norm, 1.0), value)  # (pair, 4)

    hyp_length = cider_length(np.array(counted.hyp_lengths, dtype=np.int64))[counted.pair_image]  # (pair,)
    delta = hyp_length - cider_length(counted.pair_ref_length)  # (pair,)
    penalties = {d: cider_length_penalty(float(d)) for d in np.unique(delta).tolist()}
    value = value * np.array([penalties[d] for d in delta.tolist()])[:, None]  # (pair, 4)

    per_image_n = np.stack([_sums(counted.pair_image, value[:, n], counted.num_images) for n in range(MAX_N)],
                           axis=1)  # (images, 4): each image's references summed in order
    refs_per_image = np.bincount(counted.pair_image, minlength=counted.num_images)
    total = ((per_image_n[:, 0] + per_image_n[:, 1]) + per_image_n[:, 2]) + per_image_n[:, 3]
    scores = (total / MAX_N / refs_per_image * CIDER_SCALE).tolist()
    return float(np.mean(np.array(scores))), scores


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
        scores.append(((1 + ROUGE_BETA**2) * precision * recall) / float(recall + ROUGE_BETA**2 * precision)
                      if precision != 0 and recall != 0 else 0.0)
    return float(np.mean(np.array(scores))), scores
