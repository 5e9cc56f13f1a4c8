"""The SCST reward on the host: CIDEr-D and BLEU-4 of token sequences, in Python.

The reference the device reward is held equal to, and the BLEU-4 part of the reward. CIDEr-D is
pycocoevalcap's (to 1e-6, tests/test_rewards.py), except that document frequencies come from a fixed
corpus, the training references, as in Rennie et al.: a caption's reward does not depend on its batch."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from captioner.evaluation.scorers import (CIDER_SCALE, MAX_N, NGram, NgramCounts, bleu_guesses, bleu_scores, cider_clip,
                                          cider_length, cider_length_penalty, clipped_matches, closest_ref_length,
                                          document_frequency, idf_table, log_images, max_reference_counts, ngram_counts)
from captioner.text.vocab import Vocabulary, tokenize


@dataclass
class _Vector:
    """The tf-idf vectors of one sequence, split by n-gram order, with their norms."""

    weights: list[dict[NGram, float]]  # per order k: n-gram -> tf * idf
    norms: list[float]  # per order k: the L2 norm of weights[k]
    length: int  # `scorers.cider_length`: the length penalty's argument


class CiderD:
    """CIDEr-D with document frequencies fixed from `corpus` (per image, its references' token sequences):
    an n-gram's df is the number of images whose references hold it, as pycocoevalcap counts them."""

    def __init__(self, corpus: Sequence[Sequence[Sequence[Hashable]]]) -> None:
        if not corpus:
            raise ValueError("CiderD: the document-frequency corpus is empty")
        df = document_frequency((ngram_counts(ref) for ref in refs) for refs in corpus)
        self.idf = idf_table(df, len(corpus))  # n-gram -> idf, computed once
        self.unseen_idf = log_images(len(corpus))  # an n-gram no reference of the corpus has counts as seen once
        self._references: dict[Hashable, list[_Vector]] = {}

    def add_references(self, key: Hashable, refs: Sequence[Sequence[Hashable]]) -> None:
        """Register (and vectorise, once) the references that candidates for `key` are scored against."""
        if not refs:
            raise ValueError(f"CiderD: image {key!r} has no references")
        self._references[key] = [self._vector(ngram_counts(ref), len(ref)) for ref in refs]

    def _vector(self, counts: NgramCounts, num_words: int) -> _Vector:
        weights: list[dict[NGram, float]] = [{} for _ in range(MAX_N)]
        squares = [0.0] * MAX_N
        idf, unseen = self.idf, self.unseen_idf
        for gram, tf in counts.items():
            value = float(tf) * idf.get(gram, unseen)
            weights[len(gram) - 1][gram] = value
            squares[len(gram) - 1] += value * value
        return _Vector(weights, [math.sqrt(s) for s in squares], cider_length(num_words))

    def score_one(self, candidate: Sequence[Hashable], key: Hashable) -> float:
        """CIDEr-D of one candidate against the references registered under `key`."""
        refs = self._references[key]
        hyp = self._vector(ngram_counts(candidate), len(candidate))
        total = 0.0
        for ref in refs:
            penalty = cider_length_penalty(float(hyp.length - ref.length))
            for k in range(MAX_N):
                ref_weights = ref.weights[k]
                value = 0.0
                for gram, h in hyp.weights[k].items():
                    r = ref_weights.get(gram)
                    if r is not None:
                        value += cider_clip(h, r)
                if hyp.norms[k] != 0.0 and ref.norms[k] != 0.0:
                    value /= hyp.norms[k] * ref.norms[k]
                total += value * penalty
        return total / MAX_N / len(refs) * CIDER_SCALE

    def score(self, candidates: Sequence[Sequence[Hashable]], keys: Sequence[Hashable]) -> np.ndarray:
        """(C,) CIDEr-D of candidate c against the references of image keys[c]."""
        return np.array([self.score_one(c, k) for c, k in zip(candidates, keys, strict=True)], dtype=np.float64)


class Bleu4:
    """Per-caption BLEU-4 as pycocoevalcap's `Bleu(4)` reports it for each sentence ("closest"
    reference length; its 1e-15/1e-9 smoothing, so a caption with no matching 4-gram scores ~0).
    Reference n-gram maxima are cached per image; those of `corpus` are registered under their positions."""

    def __init__(self, corpus: Sequence[Sequence[Sequence[Hashable]]] = ()) -> None:
        self._references: dict[Hashable, tuple[list[int], dict[NGram, int]]] = {}
        for key, refs in enumerate(corpus):
            self.add_references(key, refs)

    def add_references(self, key: Hashable, refs: Sequence[Sequence[Hashable]]) -> None:
        maxima = max_reference_counts(ngram_counts(ref) for ref in refs)
        self._references[key] = ([len(ref) for ref in refs], maxima)

    def score_one(self, candidate: Sequence[Hashable], key: Hashable) -> float:
        lengths, maxima = self._references[key]
        test_len = len(candidate)
        correct = clipped_matches(ngram_counts(candidate), maxima)
        return bleu_scores(correct, bleu_guesses(test_len), test_len, closest_ref_length(test_len, lengths))[-1]

    def score(self, candidates: Sequence[Sequence[Hashable]], keys: Sequence[Hashable]) -> np.ndarray:
        return np.array([self.score_one(c, k) for c, k in zip(candidates, keys, strict=True)], dtype=np.float64)


def reference_ids(vocab: Vocabulary, caption: str, oov: dict[str, int]) -> tuple[int, ...]:
    """A reference as ids ending in `<eos>`, never truncated; a word outside the vocabulary gets
    its own negative id (shared by its occurrences), so the reference keeps its true n-grams and
    document frequencies, and no sampled caption can match it (samples never hold `<unk>`)."""
    index = vocab.index
    ids = [index[word] if word in index else oov.setdefault(word, -1 - len(oov)) for word in tokenize(caption)]
    return (*ids, vocab.eos_id)


def reference_corpus(vocab: Vocabulary, references: Sequence[Sequence[str]]) -> list[list[tuple[int, ...]]]:
    """Every image's reference captions as `reference_ids`, an out-of-vocabulary word keeping
    one negative id across the whole corpus."""
    oov: dict[str, int] = {}
    return [[reference_ids(vocab, c, oov) for c in captions] for captions in references]


class CaptionReward:
    """The SCST reward: cider_weight * CIDEr-D + bleu_weight * BLEU-4 of a sampled caption. Every sequence
    ends in `<eos>` when it ended (as in Rennie et al.), so a caption that stops on "with a" loses reward.
    Keys are the images' positions in `references`."""

    def __init__(self, vocab: Vocabulary, references: Sequence[Sequence[str]], cider_weight: float = 1.0,
                 bleu_weight: float = 0.0) -> None:
        self.references = reference_corpus(vocab, references)
        self.cider_weight, self.bleu_weight = cider_weight, bleu_weight
        self.cider = CiderD(self.references)
        for key, refs in enumerate(self.references):
            self.cider.add_references(key, refs)
        self.bleu = Bleu4(self.references if bleu_weight else ())

    def __call__(self, candidates: Sequence[Sequence[int]], keys: Sequence[int]) -> np.ndarray:
        """(C,) rewards; candidates are word ids followed by `<eos>` when the caption ended."""
        reward = np.zeros(len(candidates), dtype=np.float64)
        if self.cider_weight:
            reward += self.cider_weight * self.cider.score(candidates, keys)
        if self.bleu_weight:
            reward += self.bleu_weight * self.bleu.score(candidates, keys)
        return reward
