"""The SCST reward agrees with the official scorers (pycocoevalcap) on the same token lists."""

from __future__ import annotations

import random

import numpy as np
import pytest

from captioner.rewards import Bleu4, CaptionReward, CiderD, ngram_counts, reference_ids
from captioner.vocab import Vocabulary

cider_scorer = pytest.importorskip("pycocoevalcap.cider.cider_scorer")
from pycocoevalcap.bleu.bleu import Bleu  # noqa: E402
from pycocoevalcap.cider.cider import Cider  # noqa: E402

WORDS = "a the dog cat man woman runs sits on in grass water with of red ball <eos>".split()


def random_caption(rng: random.Random, low: int = 0, high: int = 12) -> list[str]:
    return [rng.choice(WORDS[:-1]) for _ in range(rng.randint(low, high))] + (["<eos>"] if rng.random() < 0.8 else [])


def fixture(seed: int, images: int) -> tuple[list[list[str]], list[list[list[str]]]]:
    """Candidates (some empty, some repetitive, most ending in <eos>) and 1-6 references per image."""
    rng = random.Random(seed)
    candidates = [random_caption(rng) for _ in range(images)]
    candidates[0] = []
    candidates[1] = ["a", "dog", "a", "dog", "a", "dog", "<eos>"]
    references = [[random_caption(rng, 2) for _ in range(rng.randint(1, 6))] for _ in range(images)]
    candidates[2] = list(references[2][0])  # one candidate equals one of its references
    return candidates, references


def official_cider(candidates, references) -> np.ndarray:
    gts = {i: [" ".join(r) for r in refs] for i, refs in enumerate(references)}
    res = {i: [" ".join(c)] for i, c in enumerate(candidates)}
    return Cider().compute_score(gts, res)[1]


class _SizedAs(list):
    """A list that reports another length: pycocoevalcap takes log(len(crefs)) as the idf's
    numerator, so this hands it the df corpus's size while it scores the candidates' own refs."""

    def __init__(self, items: list, size: int) -> None:
        super().__init__(items)
        self.size = size

    def __len__(self) -> int:
        return self.size


def official_cider_with_corpus_df(candidates, references, corpus) -> np.ndarray:
    """pycocoevalcap's CiderScorer with its document frequencies and corpus size taken from
    `corpus` (its own compute_doc_freq over the corpus), scoring `candidates` against `references`."""
    corpus_scorer = cider_scorer.CiderScorer(n=4, sigma=6.0)
    for refs in corpus:
        corpus_scorer.crefs.append(cider_scorer.cook_refs([" ".join(r) for r in refs]))
    corpus_scorer.compute_doc_freq()
    scorer = cider_scorer.CiderScorer(n=4, sigma=6.0)
    for c, refs in zip(candidates, references):
        scorer += (" ".join(c), [" ".join(r) for r in refs])
    scorer.document_frequency = corpus_scorer.document_frequency
    scorer.crefs = _SizedAs(scorer.crefs, len(corpus))
    return np.array(scorer.compute_cider())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cider_d_equals_pycocoevalcap_when_the_corpus_is_the_scored_set(seed: int) -> None:
    candidates, references = fixture(seed, 30)
    ours = CiderD(references)
    for key, refs in enumerate(references):
        ours.add_references(key, refs)
    got = ours.score(candidates, range(len(candidates)))
    want = official_cider(candidates, references)
    assert np.abs(got - want).max() < 1e-6
    assert want.max() > 1.0 and (want == 0).any()  # the fixture spans matching and non-matching captions


@pytest.mark.parametrize("seed", [0, 3])
def test_cider_d_equals_pycocoevalcap_with_document_frequencies_from_another_corpus(seed: int) -> None:
    candidates, references = fixture(seed, 12)
    _, corpus = fixture(seed + 100, 40)
    corpus = corpus + references[:5]  # some images are in both, as training images are
    ours = CiderD(corpus)
    for key, refs in enumerate(references):
        ours.add_references(key, refs)
    got = ours.score(candidates, range(len(candidates)))
    want = official_cider_with_corpus_df(candidates, references, corpus)
    assert np.abs(got - want).max() < 1e-6
    # The df really matters: scoring with the batch's own df gives other numbers.
    assert np.abs(official_cider(candidates, references) - want).max() > 1e-3


def test_bleu4_equals_pycocoevalcap_per_caption() -> None:
    candidates, references = fixture(5, 25)
    candidates = [c if c else ["a"] for c in candidates]  # pycocoevalcap's Bleu asserts on empty captions
    bleu = Bleu4()
    for key, refs in enumerate(references):
        bleu.add_references(key, refs)
    got = bleu.score(candidates, range(len(candidates)))
    gts = {i: [" ".join(r) for r in refs] for i, refs in enumerate(references)}
    res = {i: [" ".join(c)] for i, c in enumerate(candidates)}
    want = np.array(Bleu(4).compute_score(gts, res, verbose=0)[1][3])
    assert np.abs(got - want).max() < 1e-6
    assert want.max() > 0.5


def test_ngram_counts() -> None:
    counts = ngram_counts((1, 2, 1, 2), n=4)
    assert counts[(1, 2)] == 2 and counts[(2, 1)] == 1 and counts[(1, 2, 1, 2)] == 1 and counts[(1,)] == 2
    assert sum(counts.values()) == 4 + 3 + 2 + 1


def test_caption_reward_scores_eos_and_keeps_out_of_vocabulary_reference_words() -> None:
    vocab = Vocabulary.build(["a dog runs on the grass", "a man sits with a ball"])
    references = [["a dog runs on the grass", "a brown dog runs on grass"], ["a man sits with a ball"]]
    reward = CaptionReward(vocab, references)
    oov: dict[str, int] = {}
    brown = reference_ids(vocab, "a brown dog", oov)
    assert brown[1] < 0 and brown[-1] == vocab.eos_id and oov == {"brown": -1}
    ids = lambda text: [vocab.index[w] for w in text.split()]  # noqa: E731
    good = ids("a dog runs on the grass") + [vocab.eos_id]
    bad_ending = ids("a dog runs on the") + [vocab.eos_id]
    unfinished = ids("a dog runs on the grass")  # cut at max_length: no <eos>
    scores = reward([good, bad_ending, unfinished, good], [0, 0, 0, 1])
    assert scores[0] > scores[2] > 0 and scores[0] > scores[1] > 0  # <eos> n-grams count
    assert scores[3] < scores[0]  # scored against image 1's references, not image 0's
    mixed = CaptionReward(vocab, references, cider_weight=0.5, bleu_weight=2.0)
    assert mixed([good], [0])[0] == pytest.approx(0.5 * reward.cider.score([good], [0])[0] + 2.0 * mixed.bleu.score([good], [0])[0])
