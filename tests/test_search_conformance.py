"""One suite, two searches: the torch search (captioner/models/decoding) and the numpy search of
the torch-free runtime (captioner/deploy/numpy_search.py) pass the same cases.

Both drive one decoder: `TableDecoder`, whose next word depends on the previous word and the
image alone, so that every case can be set up exactly (a caption that loops, a word that is
banned but most probable, an image that never ends) and the best caption found by enumeration.
The numpy search steps the same decoder through a numpy step function, so the two see the same
numbers, and `test_the_two_searches_find_the_same_captions` holds them to the same words, scores
and maps. Diverse groups are the torch search's alone: the runtime offers no `diverse_groups`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from captioner.core.errors import ConfigError
from captioner.deploy.numpy_search import SearchOptions, TokenRules
from captioner.deploy.numpy_search import beam_search_n_best as numpy_beam_search
from captioner.deploy.numpy_search import decode_hypotheses as numpy_decode_hypotheses
from captioner.models.decoder import Decoder, Memory, State
from captioner.models.decoding import DecodeOptions, SpecialTokens, beam_search_n_best, decode_hypotheses

# A vocabulary of 8 ids: <pad>, <bos>, <eos>, <unk>, then "a" (a bad ending), "red", "circle", "square".
V = 8
PAD, BOS, EOS, UNK, A, RED, CIRCLE, SQUARE = range(V)
SPECIAL = SpecialTokens(BOS, EOS, (PAD, BOS, UNK), bad_endings=(A,))
MAX_STEPS = 16  # the most steps a search of this suite runs
SEARCH_FIELDS = ("beam_size", "max_length", "length_penalty", "block_trigrams", "min_length", "suppress_bad_endings")


class TableDecoder(Decoder):
    """log p(next | prev, t, image) = log_softmax(table[prev] + drift[t] + bias of the image), the
    bias being the image's first feature row (feats (B, N, V)) and the small drift at step t
    keeping two captions made of the same word pairs apart; every step attends to the image's
    cells by a softmax of their first feature, so each image has its own maps."""

    vocab_size = V

    def __init__(self, table: torch.Tensor, drift: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", table)  # (V, V): prev -> next
        self.register_buffer("drift", drift)  # (T, V): per step

    def prepare(self, feats: torch.Tensor) -> Memory:
        return {"bias": feats[:, 0, :V], "attn": feats[:, :, 0].softmax(dim=-1)}  # (B, V), (B, N)

    def init_state(self, memory: Memory, capacity: int | None = None) -> State:
        return {"steps": memory["bias"].new_zeros(memory["bias"].shape[0])}  # (B,)

    def step(self, memory: Memory, prev_tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        logits = self.table[prev_tokens] + self.drift[state["steps"].long()] + memory["bias"]  # (R, V)
        logprobs = logits.log_softmax(dim=-1)  # (R, V)
        return logprobs, memory["attn"][:, None, None, :], {"steps": state["steps"] + 1}  # (R, 1, 1, N)


def table_decoder(seed: int = 0, **logits: float) -> TableDecoder:
    """A random table (seeded), with `logits` such as red_circle=4.0 added to (prev, next)."""
    generator = torch.Generator().manual_seed(seed)
    table = torch.randn(V, V, generator=generator)  # (V, V)
    drift = 0.1 * torch.randn(MAX_STEPS, V, generator=generator)  # (T, V)
    names = {"bos": BOS, "eos": EOS, "unk": UNK, "a": A, "red": RED, "circle": CIRCLE, "square": SQUARE}
    for key, value in logits.items():
        prev, word = key.split("_")
        table[names[prev] if prev != "any" else slice(None), names[word]] += value
    return TableDecoder(table, drift)


def image_feats(batch: int = 4, cells: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, cells, V, generator=torch.Generator().manual_seed(seed))  # (B, N, V)


@dataclass
class Found:
    tokens: list[int]
    score: float
    logprob: float
    finished: bool
    attn: np.ndarray  # (T, L, H, N)


Search = Callable[..., list[list[Found]]]


def torch_search(decoder: TableDecoder, feats: torch.Tensor, special: SpecialTokens = SPECIAL, as_beam: bool = False,
                 **options) -> list[list[Found]]:
    """The torch search as the library runs it (greedy for a beam of 1), or with `as_beam` its
    beam search whatever the beam."""
    opts = DecodeOptions(**options)
    search = beam_search_n_best if as_beam else decode_hypotheses
    ranked = search(decoder, feats, special, opts)
    return [[Found(h.tokens, h.score, h.logprob, h.finished, h.attn.numpy()) for h in hyps] for hyps in ranked]


def numpy_search(decoder: TableDecoder, feats: torch.Tensor, special: SpecialTokens = SPECIAL, as_beam: bool = False,
                 **options) -> list[list[Found]]:
    """The runtime's numpy search over the same decoder, stepped through a numpy step function
    (as the runtime steps its ONNX graph): greedy for a beam of 1, or with `as_beam` its beam
    search whatever the beam."""
    opts = DecodeOptions(**options)  # the runtime's defaults and checks are the schema's too

    def step(memory: dict, prev: np.ndarray, state: dict) -> tuple:
        as_torch = lambda arrays: {k: torch.from_numpy(v) for k, v in arrays.items()}  # noqa: E731
        with torch.no_grad():
            logprobs, attn, state = decoder.step(as_torch(memory), torch.from_numpy(prev), as_torch(state))
        return logprobs.numpy(), attn.numpy(), {k: v.numpy() for k, v in state.items()}

    with torch.no_grad():
        memory = decoder.prepare(feats)
        state = decoder.init_state(memory)
    memory_np, state_np = {k: v.numpy() for k, v in memory.items()}, {k: v.numpy() for k, v in state.items()}
    rules = TokenRules(special.bos, special.eos, np.isin(np.arange(V), special.banned),
                       np.isin(np.arange(V), special.bad_endings))
    search_options = SearchOptions(**{name: getattr(opts, name) for name in SEARCH_FIELDS})
    search = numpy_beam_search if as_beam else numpy_decode_hypotheses
    ranked = search(step, memory_np, state_np, rules, search_options, opts.n_best)
    return [[Found(h.tokens, h.score, h.logprob, h.finished, h.attn) for h in hyps] for hyps in ranked]


@pytest.fixture(params=["torch", "numpy"])
def search(request: pytest.FixtureRequest) -> Search:
    return {"torch": torch_search, "numpy": numpy_search}[request.param]


def repeats_a_trigram(tokens: list[int]) -> bool:
    trigrams = list(zip(tokens, tokens[1:], tokens[2:]))
    return len(set(trigrams)) < len(trigrams)


def enumerated_best(decoder: TableDecoder, feat: torch.Tensor, words: list[int], max_length: int,
                    alpha: float) -> tuple[list[int], float]:
    """The caption a beam holding every hypothesis returns: each sequence of `words` ended by
    <eos> within max_length, and each of max_length words cut off there, ranked by
    log-probability / ((5 + length) / 6) ** alpha. feat (N, V)."""
    memory = decoder.prepare(feat[None].expand(V, -1, -1))  # V rows: one per previous word
    with torch.no_grad():
        # (V, V) each
        tables = [decoder.step(memory, torch.arange(V), {"steps": torch.full((V,), float(t))})[0].double()
                  for t in range(max_length + 1)]
    best: tuple[list[int], float] = ([], float("-inf"))
    candidates = [(list(s), True) for n in range(max_length) for s in itertools.product(words, repeat=n)]
    candidates += [(list(s), False) for s in itertools.product(words, repeat=max_length)]
    for tokens, ended in candidates:
        path = [BOS, *tokens, *([EOS] if ended else [])]
        logprob = sum(float(tables[t][a, b]) for t, (a, b) in enumerate(zip(path, path[1:])))
        score = logprob / ((5.0 + len(tokens)) / 6.0) ** alpha
        if score > best[1]:
            best = (tokens, score)
    return best


# --- the cases both searches pass -------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"block_trigrams": True, "min_length": 2}, {"suppress_bad_endings": True}])
def test_greedy_decoding_is_a_beam_of_one(search: Search, options: dict) -> None:
    decoder, feats = table_decoder(any_eos=-1.0), image_feats()
    greedy = search(decoder, feats, beam_size=1, max_length=8, **options)
    beam = search(decoder, feats, beam_size=1, max_length=8, as_beam=True, **options)
    for g, b in zip(greedy, beam, strict=True):
        assert (g[0].tokens, g[0].finished) == (b[0].tokens, b[0].finished)
        assert g[0].score == pytest.approx(b[0].score, abs=1e-5)
        np.testing.assert_allclose(g[0].attn, b[0].attn, atol=1e-6)


def test_the_n_best_are_distinct_and_best_first(search: Search) -> None:
    decoder, feats = table_decoder(seed=2), image_feats(seed=3)
    ranked = search(decoder, feats, beam_size=4, n_best=4, max_length=6, length_penalty=0.6)
    best = search(decoder, feats, beam_size=4, n_best=1, max_length=6, length_penalty=0.6)
    for hyps, top in zip(ranked, best, strict=True):
        assert len(hyps) == 4 and len({tuple(h.tokens) for h in hyps}) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert hyps[0].tokens == top[0].tokens and hyps[0].score == top[0].score
        for h in hyps:
            assert h.attn.shape[0] == len(h.tokens)


def test_the_length_penalty_ranks_as_enumeration_does(search: Search) -> None:
    """A beam that holds every hypothesis of two words finds the enumeration's best caption for
    each alpha, with its score; and alpha changes the winners (a search ignoring it would fail)."""
    decoder, feats = table_decoder(seed=5, any_eos=-1.0), image_feats(batch=6, seed=5)
    special = SpecialTokens(BOS, EOS, (PAD, BOS, UNK, A, SQUARE))  # words: red and circle
    winners = {}
    for alpha in (0.0, 0.7, 2.0):
        found = search(decoder, feats, special, beam_size=32, max_length=4, length_penalty=alpha)
        expected = [enumerated_best(decoder, feat, [RED, CIRCLE], 4, alpha) for feat in feats]
        assert [hyps[0].tokens for hyps in found] == [tokens for tokens, _ in expected], alpha
        assert [hyps[0].score for hyps in found] == pytest.approx([score for _, score in expected], abs=1e-4)
        winners[alpha] = [hyps[0].tokens for hyps in found]
    assert winners[0.0] != winners[2.0] and all(len(b) >= len(a) for a, b in zip(winners[0.0], winners[2.0]))


@pytest.mark.parametrize("beam_size", [1, 3])
def test_trigram_blocking_never_repeats_a_trigram(search: Search, beam_size: int) -> None:
    decoder, feats = table_decoder(red_circle=6.0, circle_red=6.0, bos_red=6.0, any_eos=-4.0), image_feats()
    looping = search(decoder, feats, beam_size=beam_size, n_best=beam_size, max_length=10)
    assert all(repeats_a_trigram(h.tokens) for hyps in looping for h in hyps[:1])  # red circle red circle ...
    blocked = search(decoder, feats, beam_size=beam_size, n_best=beam_size, max_length=10, block_trigrams=True)
    assert not any(repeats_a_trigram(h.tokens) for hyps in blocked for h in hyps)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_banned_ids_are_never_produced_even_when_most_probable(search: Search, beam_size: int) -> None:
    decoder, feats = table_decoder(any_unk=8.0, any_red=6.0), image_feats()
    assert any(RED in h.tokens for hyps in search(decoder, feats, beam_size=beam_size, max_length=6) for h in hyps)
    special = SpecialTokens(BOS, EOS, (PAD, BOS, UNK, RED))
    for hyps in search(decoder, feats, special, beam_size=beam_size, n_best=beam_size, max_length=6):
        assert all(not {PAD, BOS, UNK, RED} & set(h.tokens) for h in hyps)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_min_length_and_bad_endings_hold_back_the_eos(search: Search, beam_size: int) -> None:
    """The favourite caption is "red a" (two words, ending on an article)."""
    decoder, feats = table_decoder(bos_red=8.0, red_a=8.0, a_eos=8.0, any_eos=2.0), image_feats()
    plain = [hyps[0] for hyps in search(decoder, feats, beam_size=beam_size, max_length=6)]
    assert all(h.tokens == [RED, A] and h.finished for h in plain)
    longer = [h for hyps in search(decoder, feats, beam_size=beam_size, n_best=beam_size, max_length=6, min_length=4)
              for h in hyps]
    assert all(len(h.tokens) >= 4 for h in longer) and any(h.finished for h in longer)
    good_endings = [h for hyps in search(decoder, feats, beam_size=beam_size, max_length=6, suppress_bad_endings=True)
                    for h in hyps]
    assert not any(h.finished and h.tokens[-1:] == [A] for h in good_endings) and any(h.finished for h in good_endings)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_an_image_that_never_ends_is_cut_at_max_length(search: Search, beam_size: int) -> None:
    decoder, feats = table_decoder(any_eos=-50.0), image_feats()
    special = SpecialTokens(BOS, EOS, (PAD, BOS, UNK, EOS))  # <eos> banned: no caption can end
    for hyps in search(decoder, feats, special, beam_size=beam_size, n_best=beam_size, max_length=5):
        assert len(hyps) == beam_size and len({tuple(h.tokens) for h in hyps}) == beam_size
        assert all(len(h.tokens) == 5 and not h.finished and h.attn.shape[0] == 5 for h in hyps)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


@pytest.mark.parametrize("options", [{"beam_size": 1}, {"beam_size": 3, "n_best": 3, "length_penalty": 1.0},
                                     {"beam_size": 2, "block_trigrams": True}])
def test_each_image_of_a_batch_finds_what_it_finds_alone(search: Search, options: dict) -> None:
    """Images end at different steps (some never do): the batch's hypotheses are each image's own."""
    decoder, feats = table_decoder(seed=6, any_eos=0.5), image_feats(batch=6, seed=7)
    feats[2, 0, EOS] = -30.0  # this image never ends
    together = search(decoder, feats, max_length=7, **options)
    for b in range(len(feats)):
        alone = search(decoder, feats[b : b + 1], max_length=7, **options)[0]
        assert [(h.tokens, h.finished) for h in together[b]] == [(h.tokens, h.finished) for h in alone], b
        assert [h.score for h in together[b]] == pytest.approx([h.score for h in alone], abs=1e-5)
        for got, want in zip(together[b], alone):
            np.testing.assert_allclose(got.attn, want.attn, atol=1e-6)
    assert not any(h.finished for h in together[2])


@pytest.mark.parametrize("as_beam", [False, True])
def test_the_search_refuses_more_hypotheses_than_beams_in_the_schemas_words(search: Search, as_beam: bool) -> None:
    if search is numpy_search:  # the runtime's search takes n_best as an argument, beside its options
        step = lambda memory, prev, state: (np.zeros((len(prev), V), np.float32),  # noqa: E731
                                            np.zeros((len(prev), 1, 1, 1), np.float32), state)
        rules = TokenRules(BOS, EOS, np.zeros(V, bool), np.zeros(V, bool))
        options = SearchOptions(2, 5, 0.0, False, 0, False)
        with pytest.raises(ConfigError,
                           match=r"^decode: n_best \(3\) must not exceed beam_size \(2\); raise the beam or sample$"):
            numpy_beam_search(step, {"x": np.zeros((1, 1))}, {"s": np.zeros(1)}, rules, options, n_best=3)
        return
    options = DecodeOptions(sample=True, beam_size=2, n_best=3)  # valid for sampling, not for a search
    with pytest.raises(ConfigError,
                       match=r"^decode: n_best \(3\) must not exceed beam_size \(2\); raise the beam or sample$"):
        beam_search_n_best(table_decoder(), image_feats(), SPECIAL, options)


# --- diverse groups: the torch search's alone -----------------------------------------------


def test_diverse_groups_give_distinct_best_first_captions_and_one_group_is_plain_search() -> None:
    """The numpy search has no diverse groups (the runtime offers no `diverse_groups`)."""
    decoder, feats = table_decoder(seed=8), image_feats(seed=9)
    diverse = torch_search(decoder, feats, beam_size=4, diverse_groups=2, diversity_strength=2.0, n_best=4,
                           max_length=6)
    for hyps in diverse:
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps) >= 2
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    one_group = torch_search(decoder, feats, beam_size=4, diverse_groups=1, n_best=4, max_length=6)
    plain = numpy_search(decoder, feats, beam_size=4, n_best=4, max_length=6)
    assert [[h.tokens for h in hyps] for hyps in one_group] == [[h.tokens for h in hyps] for hyps in plain]


# --- the two searches against each other ----------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"beam_size": 1},
        {"beam_size": 1, "block_trigrams": True, "min_length": 3, "suppress_bad_endings": True},
        {"beam_size": 3, "n_best": 3},
        {"beam_size": 4, "n_best": 2, "length_penalty": 0.8, "block_trigrams": True},
        {"beam_size": 5, "n_best": 5, "min_length": 2, "suppress_bad_endings": True, "length_penalty": 2.0},
        {"beam_size": 3, "max_length": 2},
    ],
)
def test_the_two_searches_find_the_same_captions(options: dict) -> None:
    decoder, feats = table_decoder(seed=10, any_eos=0.5), image_feats(batch=5, seed=11)
    options = {"max_length": 8, **options}
    for want, got in zip(torch_search(decoder, feats, **options), numpy_search(decoder, feats, **options), strict=True):
        assert [(h.tokens, h.finished) for h in got] == [(h.tokens, h.finished) for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5)
        assert [h.logprob for h in got] == pytest.approx([h.logprob for h in want], abs=1e-5)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.attn, w.attn, atol=1e-6)
