"""The SCST reward agrees with the official scorers (pycocoevalcap) on the same token lists."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from helpers import require_module

from captioner.text.vocab import Vocabulary
from captioner.evaluation.scorers import ngram_counts
from captioner.training.host_reward import (
    Bleu4,
    CaptionReward,
    CiderD,
    reference_ids,
)

require_module("pycocoevalcap", "the reward is compared with pycocoevalcap (pip install -e .[train])")
from pycocoevalcap.cider import cider_scorer  # noqa: E402
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
    assert mixed([good], [0])[0] == pytest.approx(0.5 * reward.cider.score([good], [0])[0]
                                                  + 2.0 * mixed.bleu.score([good], [0])[0])


# --- the vectorised reward: the same numbers from flat tensors ----------------------------------

import torch  # noqa: E402

from captioner.training.device_reward import (  # noqa: E402
    DeviceReward,
    ReferenceTable,
    cached_table,
    fingerprint,
    ngram_hashes,
    padded,
)


@pytest.mark.parametrize("seed", [0, 1])
def test_reference_table_equals_cider_d_on_random_captions(seed: int) -> None:
    """Empty, repetitive and exact-match candidates, 1-6 references of any length, negative
    (out-of-vocabulary) ids: the table gives CiderD's numbers in float64."""
    rng = random.Random(seed)
    ids = lambda caption: [WORDS.index(w) - 3 for w in caption]  # noqa: E731  ids -3..13, some negative
    candidates, references = fixture(seed, 40)
    references = [[ids(r) for r in refs] for refs in references]
    candidates = [ids(c) for c in candidates]
    candidates[3] = candidates[3] * 3  # long and repetitive
    cider = CiderD(references)
    for key, refs in enumerate(references):
        cider.add_references(key, refs)
    keys = [rng.randrange(len(references)) if i > 5 else i for i in range(len(candidates))]
    want = cider.score(candidates, keys)
    got = ReferenceTable.build(references).score(*padded(candidates), torch.tensor(keys))
    assert got.dtype == torch.float64 and np.abs(got.numpy() - want).max() < 1e-12
    assert want.max() > 1.0 and (want == 0).any()
    short = [[], [keys[0] % 5 + 1], [4, 2]]  # SCST with max_length 1 or 2: fewer positions than 4-gram orders
    got = ReferenceTable.build(references).score(*padded(short), torch.tensor([0, 1, 2]))
    assert np.abs(got.numpy() - cider.score(short, [0, 1, 2])).max() < 1e-12


@pytest.fixture(scope="module")
def coco_val(shared_data) -> tuple[dict[int, list[str]], dict[int, str]]:
    """COCO val2014's references (image id -> captions) and the official demo results file's
    machine captions (image id -> caption)."""
    import json

    from captioner.evaluation.results_files import load_references

    references = load_references(shared_data / "coco" / "captions_val2014.json")
    results = json.loads((shared_data / "coco" / "captions_val2014_fakecap_results.json").read_text())
    return references, {r["image_id"]: r["caption"] for r in results}


def test_device_reward_equals_caption_reward_on_real_coco_captions(coco_val) -> None:
    """The official demo's 1,000 machine captions and held-out human captions, scored against
    2,000 COCO val2014 images' references (document frequencies from all of them), by the old
    Python reward and the new table: equal to 1e-6 in float64 (1e-12 in fact); in float32, as on
    a GPU, to 2e-5 of a CIDEr-D that reaches ~3."""
    from captioner.text.vocab import Vocabulary

    references, results = coco_val
    images = list(results) + [i for i in references if i not in results][:1000]  # (2000,) image ids
    texts = [references[i] for i in images]
    vocab = Vocabulary.build((c for captions in texts for c in captions), 5)
    old = CaptionReward(vocab, texts)
    new = DeviceReward(vocab, texts)
    oov: dict[str, int] = {}
    machine = [list(reference_ids(vocab, results[i], oov)) for i in images[:1000]]  # the demo's captions
    # cut: some without <eos>
    human = [list(reference_ids(vocab, texts[k][k % 5], oov))[: 3 + k % 12] for k in range(1000, 1500)]
    # a sample holds vocabulary ids only
    candidates = [[w if w >= 0 else vocab.unk_id for w in c] for c in machine + human]
    keys = list(range(1000)) + list(range(1000, 1500))
    want = old(candidates, keys)
    got = new(*padded(candidates), torch.tensor(keys))
    assert np.abs(got.numpy() - want).max() < 1e-6
    assert want.max() > 2.0 and np.median(want) > 0.3  # real overlaps, not a table of zeros
    got32 = new.table.to("cpu", torch.float32).score(*padded(candidates), torch.tensor(keys))
    assert got32.dtype == torch.float32 and np.abs(got32.numpy() - want).max() < 2e-5


def words_of(vocab: Vocabulary, oov: dict[str, int]):
    """Token ids (vocabulary ids, negative out-of-vocabulary ones, <eos>) -> the caption as
    pycocoevalcap takes it: the same tokens, joined by spaces."""
    names = {index: word for word, index in oov.items()}
    return lambda ids: " ".join(vocab.words[i] if i >= 0 else names[i] for i in ids)


def test_cider_d_equals_pycocoevalcap_on_the_official_demo_results(coco_val) -> None:
    """pycocoevalcap's CIDEr-D on the official evaluation demo's 1,000 COCO val2014 machine
    captions against their references, tokenised as the reward tokenises them (`reference_ids`:
    the PTB-style tokenizer, then <eos>): the vectorised table and the Python CiderD give its
    per-caption numbers to 1e-6. (The installed pycocoevalcap has no class named CiderD: its
    `Cider` is CIDEr-D, clipped tf-idf and the Gaussian length penalty, with document
    frequencies from the scored set, which is what this test gives the table.)"""
    references, results = coco_val
    images = sorted(results)  # (1000,) image ids
    vocab = Vocabulary.build((c for i in images for c in references[i]), 5)
    oov: dict[str, int] = {}
    refs = [[reference_ids(vocab, c, oov) for c in references[i]] for i in images]
    candidates = [reference_ids(vocab, results[i], oov) for i in images]  # out-of-vocabulary words keep their own ids
    text = words_of(vocab, oov)
    want = official_cider([text(c).split() for c in candidates], [[text(r).split() for r in rs] for rs in refs])
    table = ReferenceTable.build(refs).score(*padded(candidates), torch.arange(len(images)))  # (1000,) float64
    cider = CiderD(refs)
    for key, rs in enumerate(refs):
        cider.add_references(key, rs)
    assert np.abs(table.numpy() - want).max() < 1e-6
    assert np.abs(cider.score(candidates, range(len(images))) - want).max() < 1e-6
    assert want.max() > 2.0 and 0.3 < want.mean() < 2.0  # real overlaps, not a table of zeros
    assert min(oov.values()) < -100  # out-of-vocabulary reference words were in play


def test_device_reward_equals_pycocoevalcap_with_the_training_corpus_df_on_real_coco_captions(coco_val) -> None:
    """The SCST reward as training runs it (`DeviceReward`: document frequencies from all the
    training references, not the batch's) on COCO val2014: 2,000 images' references as the
    corpus, the demo's 1,000 machine captions and 500 held-out human captions (some cut before
    <eos>) as a sampler gives them (vocabulary ids, <unk> for the rest), scored against their own
    image. pycocoevalcap's CiderScorer, handed the corpus's document frequencies and size, gives
    the same numbers to 1e-6."""
    references, results = coco_val
    images = sorted(results) + [i for i in sorted(references) if i not in results][:1000]  # (2000,) image ids
    texts = [references[i] for i in images]
    vocab = Vocabulary.build((c for captions in texts for c in captions), 5)
    reward = DeviceReward(vocab, texts)
    oov: dict[str, int] = {}
    # as reference_corpus gives the reward
    corpus = [[reference_ids(vocab, c, oov) for c in captions] for captions in texts]
    machine = [list(reference_ids(vocab, results[i], {})) for i in images[:1000]]
    human = [list(corpus[k][k % 5])[: 3 + k % 12] for k in range(1000, 1500)]
    candidates = [[w if w >= 0 else vocab.unk_id for w in c] for c in machine + human]  # what a sampler can write
    keys = list(range(1500))
    got = reward(*padded(candidates), torch.tensor(keys))  # (1500,) float64
    text = words_of(vocab, oov)
    corpus_words = [[text(r).split() for r in refs] for refs in corpus]
    want = official_cider_with_corpus_df([text(c).split() for c in candidates], [corpus_words[k] for k in keys],
                                         corpus_words)
    assert np.abs(got.numpy() - want).max() < 1e-6
    assert want.max() > 2.0 and np.median(want) > 0.3  # real overlaps, not a table of zeros


def test_distinct_ngrams_of_coco_val_do_not_collide(coco_val) -> None:
    """Every distinct 1..4-gram of COCO val2014's 202,654 captions gets its own 64-bit hash:
    compared with an exact injective code of the same n-grams (word ids in base V+1). Words are
    split on white space (the PTB tokenizer would take 10 s here, and any real corpus will do)."""
    references, _ = coco_val
    captions = [c.lower().split() for captions in references.values() for c in captions]
    words = {w: i + 1 for i, w in enumerate(sorted({w for c in captions for w in c}))}  # ids 1..V
    base = len(words) + 1
    assert base**4 < 2**62  # the exact code fits in an int64
    hashes, exact = [], []
    for start in range(0, len(captions), 50000):
        tokens, lengths = padded([[words[w] for w in c] for c in captions[start : start + 50000]])  # (R, L), (R,)
        h, valid, order = ngram_hashes(tokens, lengths)  # (R, W) each
        code = torch.zeros_like(tokens)  # (R, L)
        codes = []
        for k in range(1, 5):
            code = code[:, : tokens.shape[1] - k + 1] + tokens[:, k - 1 :] * base ** (k - 1)  # (R, L-k+1)
            codes.append(code)
        hashes.append(h[valid])
        exact.append(torch.cat(codes, dim=1)[valid])
    distinct = torch.unique(torch.cat(exact)).numel()
    assert distinct > 1_000_000  # the real corpus's n-grams
    assert torch.unique(torch.cat(hashes)).numel() == distinct


def test_a_table_is_built_unheld_where_the_file_system_has_no_locks(tmp_path, monkeypatch) -> None:
    """SCST's reward table is built under machine_cache.exclusive; on a network file system whose flock fails
    (ENOLCK) that was an OSError's traceback at the start of training. Now the table is built unheld."""
    import errno
    import fcntl

    def no_locks(*args: object) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    references = [[[WORDS.index(w) for w in r] for r in refs] for refs in fixture(3, 4)[1]]
    table = cached_table(tmp_path, "k1", lambda: ReferenceTable.build(references))
    assert (tmp_path / "reward_table_k1" / "complete").is_file()
    assert torch.equal(table.ref_weights, ReferenceTable.build(references).ref_weights)


def test_tables_are_saved_once_and_memory_mapped(tmp_path) -> None:
    candidates, references = fixture(7, 20)
    references = [[[WORDS.index(w) for w in r] for r in refs] for refs in references]
    built = []

    def build() -> ReferenceTable:
        built.append(1)
        return ReferenceTable.build(references)

    first = cached_table(tmp_path, "k1", build)
    again = cached_table(tmp_path, "k1", build)  # another rank: maps the saved files
    assert len(built) == 1
    for name in ReferenceTable.__dataclass_fields__:
        assert torch.equal(getattr(first, name), getattr(again, name)), name
    maps = Path("/proc/self/maps").read_text()
    # mapped, not copied
    assert all(str(tmp_path / "reward_table_k1" / f"{name}.npy") in maps for name in ("ref_weights", "df_hashes"))
    cands = [[WORDS.index(w) for w in c] for c in candidates]
    keys = torch.arange(len(cands))
    assert torch.equal(again.score(*padded(cands), keys), ReferenceTable.build(references).score(*padded(cands), keys))
    words = ["a", "dog"]
    assert fingerprint(words, [["a dog"]]) != fingerprint(words, [["a dog", "a cat"]])  # other references, other file
    assert fingerprint(words, [["a dog"]]) != fingerprint(["a", "cat"], [["a dog"]])  # other vocabulary too
    with pytest.raises(Exception, match="no references"):
        ReferenceTable.build([[[1, 2]], []])


def test_reference_table_scores_in_its_own_precision_under_autocast() -> None:
    """SCST runs inside train_one_epoch's autocast (bf16 on CUDA): the reward must not drop to
    bf16 matmuls. The float32 table (as on a GPU) gives the same scores with autocast on."""
    candidates, references = fixture(4, 30)
    references = [[[WORDS.index(w) for w in r] for r in refs] for refs in references]
    tokens, lengths = padded([[WORDS.index(w) for w in c] for c in candidates])
    table = ReferenceTable.build(references).to("cpu", torch.float32)
    plain = table.score(tokens, lengths, torch.arange(len(candidates)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = table.score(tokens, lengths, torch.arange(len(candidates)))
    assert autocast.dtype == torch.float32 and torch.equal(autocast, plain)
