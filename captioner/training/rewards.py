"""Caption rewards for self-critical training: CIDEr-D and BLEU-4 on token sequences.

CIDEr-D here is the official one (pycocoevalcap's `CiderScorer`: tf-idf n-gram vectors for
n = 1..4, clipped cosine similarity, a Gaussian length penalty with sigma 6, x10) with one
difference that the field makes on purpose (Rennie et al. 2017; ruotianluo's self-critical.pytorch):
the document frequencies and the log corpus size come from a fixed corpus, the training references,
computed once, not from the captions being scored. A batch of 50 images then scores every caption
against the same idf weights, and the reward of a caption does not depend on its batch mates.

Sequences are tuples of any hashable tokens (word ids, strings). Every reference's tf-idf vectors
are computed once per image and cached; scoring a candidate is then one pass over its own n-grams
per reference, which is what makes the reward cheap next to a decoder step (docs/benchmarks.md).

`CiderD.score(candidates, image_keys)` agrees with pycocoevalcap fed the same document
frequencies and corpus size to 1e-6 (tests/test_rewards.py), including pycocoevalcap's quirk that
the "length" in the length penalty counts bigrams (a caption's words minus one).
"""

from __future__ import annotations

import functools
import math
import os
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from captioner.text.vocab import Vocabulary, tokenize
from captioner.training.reward_table import ReferenceTable, cached_table, fingerprint

NGram = tuple[Hashable, ...]


def ngram_counts(tokens: Sequence[Hashable], n: int = 4) -> Counter:
    """Counts of every 1..n-gram of a token sequence (the `precook` of the COCO scorers)."""
    tokens = tuple(tokens)
    counts: Counter = Counter()
    for k in range(1, n + 1):
        for i in range(len(tokens) - k + 1):
            counts[tokens[i : i + k]] += 1
    return counts


@dataclass
class _Vector:
    """The tf-idf vectors of one sequence, split by n-gram order, with their norms."""

    weights: list[dict[NGram, float]]  # per order k: n-gram -> tf * idf
    norms: list[float]  # per order k: the L2 norm of weights[k]
    length: int  # bigram count (pycocoevalcap's `length`): the length-penalty's argument


class CiderD:
    """CIDEr-D with document frequencies fixed from a reference corpus.

    `corpus` holds, per image, the token sequences of its references; the document frequency of an
    n-gram is the number of images whose references contain it, and log(number of images) is the
    idf's numerator, as pycocoevalcap computes them when the corpus is the scored set itself.
    `references` (default: the corpus) are the references each candidate is scored against,
    looked up by key; their vectors are built on first use and cached.
    """

    def __init__(
        self,
        corpus: Iterable[Sequence[Sequence[Hashable]]],
        n: int = 4,
        sigma: float = 6.0,
    ) -> None:
        self.n = n
        self.sigma = sigma
        self.document_frequency: Counter = Counter()
        num_images = 0
        for refs in corpus:
            num_images += 1
            self.document_frequency.update({g for ref in refs for g in ngram_counts(ref, n)})
        if num_images == 0:
            raise ValueError("CiderD: the document-frequency corpus is empty")
        self.log_num_images = math.log(float(num_images))
        self._references: dict[Hashable, list[_Vector]] = {}

    def add_references(self, key: Hashable, refs: Sequence[Sequence[Hashable]]) -> None:
        """Register (and vectorise, once) the references that candidates for `key` are scored against."""
        if not refs:
            raise ValueError(f"CiderD: image {key!r} has no references")
        self._references[key] = [self._vector(ngram_counts(ref, self.n)) for ref in refs]

    def _vector(self, counts: Counter) -> _Vector:
        weights: list[dict[NGram, float]] = [{} for _ in range(self.n)]
        squares = [0.0] * self.n
        length = 0
        df, log_n = self.document_frequency, self.log_num_images
        for gram, tf in counts.items():
            k = len(gram) - 1
            # An n-gram no reference of the corpus has counts as seen once (idf = log N).
            value = float(tf) * (log_n - math.log(max(1.0, float(df.get(gram, 0.0)))))
            weights[k][gram] = value
            squares[k] += value * value
            if k == 1:
                length += tf
        return _Vector(weights, [math.sqrt(s) for s in squares], length)

    def score_one(self, candidate: Sequence[Hashable], key: Hashable) -> float:
        """CIDEr-D of one candidate against the references registered under `key`."""
        refs = self._references[key]
        hyp = self._vector(ngram_counts(candidate, self.n))
        total = 0.0
        for ref in refs:
            delta = float(hyp.length - ref.length)
            penalty = math.exp(-(delta * delta) / (2.0 * self.sigma * self.sigma))
            for k in range(self.n):
                ref_weights = ref.weights[k]
                value = 0.0
                for gram, h in hyp.weights[k].items():
                    r = ref_weights.get(gram)
                    if r is not None:
                        value += min(h, r) * r  # clipped: repeating an n-gram earns nothing past the reference's count
                if hyp.norms[k] != 0.0 and ref.norms[k] != 0.0:
                    value /= hyp.norms[k] * ref.norms[k]
                total += value * penalty
        return total / self.n / len(refs) * 10.0

    def score(self, candidates: Sequence[Sequence[Hashable]], keys: Sequence[Hashable]) -> np.ndarray:
        """(C,) CIDEr-D of candidate c against the references of image keys[c]."""
        return np.array([self.score_one(c, k) for c, k in zip(candidates, keys, strict=True)], dtype=np.float64)


class Bleu4:
    """Per-caption BLEU-4 as pycocoevalcap's `Bleu(4)` reports it for each sentence ("closest"
    reference length; its 1e-15/1e-9 smoothing, so a caption with no matching 4-gram scores ~0).
    Reference n-gram maxima are cached per image."""

    def __init__(self, n: int = 4) -> None:
        self.n = n
        self._references: dict[Hashable, tuple[list[int], dict[NGram, int]]] = {}

    @classmethod
    def of(cls, corpus: Sequence[Sequence[Sequence[Hashable]]]) -> Bleu4:
        """Every image's references registered under its position in `corpus`."""
        bleu = cls()
        for key, refs in enumerate(corpus):
            bleu.add_references(key, refs)
        return bleu

    def add_references(self, key: Hashable, refs: Sequence[Sequence[Hashable]]) -> None:
        maxima: dict[NGram, int] = {}
        for ref in refs:
            for gram, count in ngram_counts(ref, self.n).items():
                if count > maxima.get(gram, 0):
                    maxima[gram] = count
        self._references[key] = ([len(ref) for ref in refs], maxima)

    def score_one(self, candidate: Sequence[Hashable], key: Hashable) -> float:
        lengths, maxima = self._references[key]
        test_len = len(candidate)
        correct = [0] * self.n
        for gram, count in ngram_counts(candidate, self.n).items():
            correct[len(gram) - 1] += min(maxima.get(gram, 0), count)
        bleu = 1.0
        for k in range(self.n):
            bleu *= (correct[k] + 1e-15) / (max(0, test_len - k) + 1e-9)
        bleu **= 1.0 / self.n
        ref_len = min((abs(length - test_len), length) for length in lengths)[1]
        ratio = (test_len + 1e-15) / (ref_len + 1e-9)
        if ratio < 1:
            bleu *= math.exp(1 - 1 / ratio)
        return bleu

    def score(self, candidates: Sequence[Sequence[Hashable]], keys: Sequence[Hashable]) -> np.ndarray:
        return np.array([self.score_one(c, k) for c, k in zip(candidates, keys, strict=True)], dtype=np.float64)


def reference_ids(vocab: Vocabulary, caption: str, oov: dict[str, int]) -> tuple[int, ...]:
    """A reference as ids ending in `<eos>`, never truncated; a word outside the vocabulary gets
    its own negative id (shared by its occurrences), so the reference keeps its true n-grams and
    document frequencies, and no sampled caption can match it (samples never hold `<unk>`)."""
    ids = []
    for word in tokenize(caption):
        index = vocab.index.get(word)
        if index is None:
            index = oov.setdefault(word, -1 - len(oov))
        ids.append(index)
    return (*ids, vocab.eos_id)


def reference_corpus(vocab: Vocabulary, references: Sequence[Sequence[str]]) -> list[list[tuple[int, ...]]]:
    """Every image's reference captions as `reference_ids`, an out-of-vocabulary word keeping
    one negative id across the whole corpus."""
    oov: dict[str, int] = {}
    return [[reference_ids(vocab, c, oov) for c in captions] for captions in references]


class CaptionReward:
    """The SCST reward: cider_weight * CIDEr-D + bleu_weight * BLEU-4 of a sampled caption.

    Built once from the training images' references (document frequencies from all of them).
    Every sequence, candidate and reference alike, ends in `<eos>` when it ended, as in Rennie et
    al.: a caption that stops on "with a" then lacks the "a <eos>" n-grams no reference has and
    loses reward, which keeps bad endings rare. Keys are the images' positions in `references`.
    """

    def __init__(
        self,
        vocab: Vocabulary,
        references: Sequence[Sequence[str]],
        cider_weight: float = 1.0,
        bleu_weight: float = 0.0,
    ) -> None:
        self.references = reference_corpus(vocab, references)
        self.eos_id = vocab.eos_id
        self.cider_weight, self.bleu_weight = cider_weight, bleu_weight
        self.cider = CiderD(self.references)
        for key, refs in enumerate(self.references):
            self.cider.add_references(key, refs)
        self.bleu = Bleu4.of(self.references) if bleu_weight else Bleu4()

    def __call__(self, candidates: Sequence[Sequence[int]], keys: Sequence[int]) -> np.ndarray:
        """(C,) rewards; candidates are word ids followed by `<eos>` when the caption ended."""
        reward = np.zeros(len(candidates), dtype=np.float64)
        if self.cider_weight:
            reward += self.cider_weight * self.cider.score(candidates, keys)
        if self.bleu_weight:
            reward += self.bleu_weight * self.bleu.score(candidates, keys)
        return reward


class DeviceReward:
    """The SCST reward computed where the samples are: cider_weight * CIDEr-D from a
    `reward_table.ReferenceTable` (the same numbers as `CaptionReward`'s, to 1e-12 in float64),
    plus bleu_weight * BLEU-4, which still runs on the host (it reads the tokens back: one wait
    for the device per step, only when bleu_weight > 0).

    With `cache_dir` the table is built once and saved there under a fingerprint of the
    vocabulary and the references, and every process (the ranks of a node) memory-maps the same
    files; it is copied to a GPU once per process (float32 weights there, float64 on the CPU).
    """

    def __init__(
        self,
        vocab: Vocabulary,
        references: Sequence[Sequence[str]],
        cider_weight: float = 1.0,
        bleu_weight: float = 0.0,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.cider_weight, self.bleu_weight = cider_weight, bleu_weight
        # Tokenised only when something needs it: a table already cached needs no references.
        corpus = functools.cache(lambda: reference_corpus(vocab, references))
        build = lambda: ReferenceTable.build(corpus())  # noqa: E731
        self.table = cached_table(cache_dir, fingerprint(vocab.words, references), build) if cache_dir else build()
        self.bleu = Bleu4.of(corpus()) if bleu_weight else Bleu4()
        self._tables: dict[torch.device, ReferenceTable] = {}

    def on(self, device: torch.device) -> ReferenceTable:
        """The table on `device`, copied there once."""
        if device not in self._tables:
            self._tables[device] = self.table if device.type == "cpu" else self.table.to(device, torch.float32)
        return self._tables[device]

    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """(C,) rewards of the captions tokens[c, :lengths[c]] (word ids, then <eos> where it
        ended) against the references of dataset image images[c]; on tokens' device."""
        table = self.on(tokens.device)
        reward = torch.zeros(tokens.shape[0], dtype=table.ref_weights.dtype, device=tokens.device)  # (C,)
        if self.cider_weight:
            reward = reward + self.cider_weight * table.score(tokens, lengths, images)
        if self.bleu_weight:
            candidates = [row[:length] for row, length in zip(tokens.tolist(), lengths.tolist())]
            bleu = self.bleu.score(candidates, images.tolist())  # (C,) on the host
            reward = reward + self.bleu_weight * torch.as_tensor(bleu, dtype=reward.dtype).to(reward.device)
        return reward
