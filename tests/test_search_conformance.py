"""One suite, three searches: the torch search (captioner/models/decoding), the numpy search of the
torch-free runtime (captioner/deploy/numpy_search.py) and the web page's (captioner/deploy/web/search.js)
pass the same cases, the data of tests/data/search_cases.json (written by tests/search_cases.py).

Every case decodes with a `TableDecoder`, whose next word depends on the previous word, the step and
the image alone, so that every case can be set up exactly (a caption that loops, a word that is
banned but most probable, an image that never ends) and the best caption found by enumeration. The
file holds its step as lookup tables, and each search here steps through them (`LookupDecoder` for
torch, `lookup_step` for numpy), so all see the same numbers. A case holds the numpy search's
hypotheses: `test_every_case_is_reproduced` holds both Python searches to them (words and endings
exactly, scores to 1e-5, maps to 1e-6), and Node's tests/js/search.test.mjs holds search.js to them
(`test_the_javascript_tests_pass` runs Node). Diverse groups are the torch search's alone: the
runtime offers no `diverse_groups`.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from search_cases import (
    BOS, CIRCLE, EOS, PAD, RED, REWRITE, SEARCH_FIELDS, UNK, V, A, Tables, build, load, lookup_step, render,
)
from search_cases import PATH as FIXTURE_PATH

from captioner.core.errors import ConfigError
from captioner.deploy.numpy_search import SearchOptions, TokenRules, top_descending
from captioner.deploy.numpy_search import beam_search_n_best as numpy_beam_search
from captioner.deploy.numpy_search import decode_hypotheses as numpy_decode_hypotheses
from captioner.models.decoder import Decoder, Memory, State
from captioner.models.decoding import DecodeOptions, SpecialTokens, beam_search_n_best, decode_hypotheses
from helpers import REPO, require

FIXTURE = load()
TABLES = {name: Tables.from_json(data) for name, data in FIXTURE["tables"].items()}
CASES = {case["name"]: case for case in FIXTURE["cases"]}
REFUSAL = r"^decode: n_best \(3\) must not exceed beam_size \(2\); raise the beam or sample$"


class LookupDecoder(Decoder):
    """A table set's TableDecoder, stepped from its lookup tables: feats (B, 1, 1) hold image ids, the
    memory {"image"} (R,), the state {"steps", "image"} (R,) each (the state's image checks that
    the search gathers the state's rows with their beams)."""

    vocab_size = V

    def __init__(self, tables: Tables) -> None:
        super().__init__()
        self.register_buffer("logprobs", torch.from_numpy(tables.logprobs))  # (B, T, V, V)
        self.register_buffer("attn", torch.from_numpy(tables.attn))  # (B, V, N)
        self.calls = 0  # steps taken

    def prepare(self, feats: torch.Tensor) -> Memory:
        return {"image": feats[:, 0, 0].long()}  # (B,)

    def init_state(self, memory: Memory, capacity: int | None = None) -> State:
        return {"steps": torch.zeros_like(memory["image"]), "image": memory["image"].clone()}  # (B,) each

    def step(self, memory: Memory, prev_tokens: torch.Tensor, state: State) -> tuple[torch.Tensor, torch.Tensor, State]:
        image, steps = memory["image"], state["steps"]
        assert torch.equal(state["image"], image), "the state's rows left their image"
        self.calls += 1
        attn = self.attn[image, prev_tokens][:, None, None, :]  # (R, 1, 1, N)
        return self.logprobs[image, steps, prev_tokens], attn, {"steps": steps + 1, "image": state["image"]}


@dataclass
class Found:
    tokens: list[int]
    score: float
    logprob: float
    finished: bool
    attn: np.ndarray  # (T, L, H, N)


Search = Callable[..., list[list[Found]]]


def case_tables(case: dict, images: list[int] | None) -> Tables:
    tables = TABLES[case["tables"]]
    return tables if images is None else tables.subset(images)


def decode_options(case: dict, overrides: dict) -> DecodeOptions:
    return DecodeOptions(**case["options"], n_best=case["n_best"], **overrides)


def torch_search(case: dict, images: list[int] | None = None, steps: list[int] | None = None,
                 **overrides) -> list[list[Found]]:
    """The torch search on `case` (its images, or `images` of its tables) as the library runs it:
    greedy for a beam of 1 unless the case's search is "beam"; `overrides`: more DecodeOptions;
    `steps` gets the number of steps it ran."""
    tables = case_tables(case, images)
    feats = torch.arange(len(tables.attn), dtype=torch.float32).view(-1, 1, 1)  # (B, 1, 1): image ids
    special = SpecialTokens(case["bos"], case["eos"], tuple(case["banned"]), tuple(case["bad_endings"]))
    search = beam_search_n_best if case["search"] == "beam" else decode_hypotheses
    decoder = LookupDecoder(tables)
    ranked = search(decoder, feats, special, decode_options(case, overrides))
    if steps is not None:
        steps.append(decoder.calls)
    return [[Found(h.tokens, h.score, h.logprob, h.finished, h.attn.numpy()) for h in hyps] for hyps in ranked]


def numpy_search(case: dict, images: list[int] | None = None, steps: list[int] | None = None) -> list[list[Found]]:
    """The runtime's numpy search on `case`, stepped through its tables as the runtime steps its ONNX
    graph: greedy for a beam of 1 unless the case's search is "beam"; `steps` gets the number of
    steps it ran."""
    tables = case_tables(case, images)
    opts = decode_options(case, {})  # the runtime's defaults and checks are the schema's too
    ids = np.arange(len(tables.attn), dtype=np.int64)  # (B,)
    memory, state = {"image": ids}, {"steps": np.zeros_like(ids), "image": ids.copy()}
    rules = TokenRules(case["bos"], case["eos"], np.isin(np.arange(V), case["banned"]),
                       np.isin(np.arange(V), case["bad_endings"]))
    search_options = SearchOptions(**{name: getattr(opts, name) for name in SEARCH_FIELDS})
    search = numpy_beam_search if case["search"] == "beam" else numpy_decode_hypotheses
    step, calls = lookup_step(tables), []
    counted = lambda *arguments: calls.append(1) or step(*arguments)  # noqa: E731
    ranked = search(counted, memory, state, rules, search_options, opts.n_best)
    if steps is not None:
        steps.append(len(calls))
    return [[Found(h.tokens, h.score, h.logprob, h.finished, h.attn) for h in hyps] for hyps in ranked]


def expected(case: dict) -> list[list[Found]]:
    """The case's hypotheses as the file holds them, maps (T, 1, 1, N)."""
    cells = TABLES[case["tables"]].attn.shape[2]
    return [[Found(h["tokens"], h["score"], h["logprob"], h["finished"],
                   np.array(h["attn"], np.float32).reshape(len(h["tokens"]), 1, 1, cells)) for h in hyps]
            for hyps in case["expected"]]


@pytest.fixture(params=["torch", "numpy"])
def search(request: pytest.FixtureRequest) -> Search:
    return {"torch": torch_search, "numpy": numpy_search}[request.param]


def assert_same_hypotheses(got: list[list[Found]], want: list[list[Found]], exact_order: bool = True) -> None:
    """Per image the same words and endings in the same order, scores and log-probabilities to 1e-5,
    maps to 1e-6; without `exact_order`, hypotheses of equal score may come in either order."""
    assert len(got) == len(want)
    for b, (g, w) in enumerate(zip(got, want, strict=True)):
        if not exact_order:  # put equal scores in one order, by words
            g, w = (sorted(hyps, key=lambda h: (-round(h.score, 5), h.tokens)) for hyps in (g, w))
        assert [(h.tokens, h.finished) for h in g] == [(h.tokens, h.finished) for h in w], b
        assert [h.score for h in g] == pytest.approx([h.score for h in w], abs=1e-5), b
        assert [h.logprob for h in g] == pytest.approx([h.logprob for h in w], abs=1e-5), b
        for got_h, want_h in zip(g, w):
            np.testing.assert_allclose(got_h.attn, want_h.attn, atol=1e-6)


def repeats_a_trigram(tokens: list[int]) -> bool:
    trigrams = list(zip(tokens, tokens[1:], tokens[2:]))
    return len(set(trigrams)) < len(trigrams)


def enumerated_best(tables: Tables, b: int, words: list[int], max_length: int, alpha: float) -> tuple[list[int], float]:
    """The caption a beam holding every hypothesis returns: each sequence of `words` ended by
    <eos> within max_length, and each of max_length words cut off there, ranked by
    log-probability / ((5 + length) / 6) ** alpha, for image b of `tables`."""
    best: tuple[list[int], float] = ([], float("-inf"))
    candidates = [(list(s), True) for n in range(max_length) for s in itertools.product(words, repeat=n)]
    candidates += [(list(s), False) for s in itertools.product(words, repeat=max_length)]
    for tokens, ended in candidates:
        path = [BOS, *tokens, *([EOS] if ended else [])]
        logprob = sum(float(tables.logprobs[b, t, prev, word]) for t, (prev, word) in enumerate(zip(path, path[1:])))
        score = logprob / ((5.0 + len(tokens)) / 6.0) ** alpha
        if score > best[1]:
            best = (tokens, score)
    return best


# --- the file: current, and every case reproduced -------------------------------------------


def test_the_file_is_what_its_cases_give() -> None:
    """tests/data/search_cases.json is tests/search_cases.py's output, bit for bit: edit the cases there."""
    if render(build()) != FIXTURE_PATH.read_text():
        pytest.fail(f"{FIXTURE_PATH.name} is not what tests/search_cases.py writes: rewrite it with `{REWRITE}`",
                    pytrace=False)


@pytest.mark.parametrize("name", list(CASES))
def test_every_case_is_reproduced(search: Search, name: str) -> None:
    """Both searches find each case's hypotheses, in as many steps (the same stopping rule). Torch's
    topk orders equal values as it likes, so on the case of exact ties the torch search may list
    hypotheses of equal score in another order."""
    case, steps = CASES[name], []
    found = search(case, steps=steps)
    assert_same_hypotheses(found, expected(case), exact_order=not (search is torch_search and "ties" in name))
    assert steps == [case["steps"]]


def test_the_fixture_covers_every_rule_with_well_defined_ties() -> None:
    """Each test's cases are there; ties/beam lists captions of exactly equal scores, best first by
    the lower index (red before circle), on finished and live hypotheses both."""
    assert {name.split("/")[0] for name in CASES} >= {"greedy", "n_best", "length_penalty", "trigrams", "banned",
                                                       "min_length", "first_word", "endless", "batch", "diverse",
                                                       "agree", "ties"}
    ties = expected(CASES["ties/beam"])
    assert [[h.tokens[:1] for h in hyps] for hyps in ties] == [[[RED], [CIRCLE]]] * len(ties)
    assert all(hyps[0].score == hyps[1].score for hyps in ties) and {h.finished for hyps in ties for h in hyps} == {
        True, False}
    assert all(hyps[0].tokens[:1] == [RED] for hyps in expected(CASES["ties/greedy"]))


def test_numpy_selection_breaks_ties_by_the_lower_index_at_the_boundary_too() -> None:
    """argpartition alone keeps any of the values tied with the k-th; the runtime's selection (and the
    page's, which mirrors it) keeps the lower indices, as a stable sort does, on rows full of ties."""
    rows = np.random.default_rng(0).integers(0, 3, size=(400, 12)).astype(np.float32)  # (R, M): many ties
    rows[::7, 3:] = -np.inf  # dead beams tie at -inf
    for k in (1, 2, 5, 11, 12):
        assert np.array_equal(top_descending(rows, k), np.argsort(-rows, axis=1, kind="stable")[:, :k])


# --- the cases both searches pass -------------------------------------------------------------


@pytest.mark.parametrize("label", ["plain", "trigrams", "bad_endings"])
def test_greedy_decoding_is_a_beam_of_one(search: Search, label: str) -> None:
    greedy, beam = search(CASES[f"greedy/{label}/decode"]), search(CASES[f"greedy/{label}/beam"])
    assert CASES[f"greedy/{label}/beam"]["options"]["beam_size"] == 1
    for g, b in zip(greedy, beam, strict=True):
        assert (g[0].tokens, g[0].finished) == (b[0].tokens, b[0].finished)
        assert g[0].score == pytest.approx(b[0].score, abs=1e-5)
        np.testing.assert_allclose(g[0].attn, b[0].attn, atol=1e-6)


def test_the_n_best_are_distinct_and_best_first(search: Search) -> None:
    ranked, best = search(CASES["n_best/4"]), search(CASES["n_best/1"])
    for hyps, top in zip(ranked, best, strict=True):
        assert len(hyps) == 4 and len({tuple(h.tokens) for h in hyps}) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert hyps[0].tokens == top[0].tokens and hyps[0].score == top[0].score
        for h in hyps:
            assert h.attn.shape[0] == len(h.tokens)


def test_the_length_penalty_ranks_as_enumeration_does(search: Search) -> None:
    """A beam that holds every hypothesis of two words finds the enumeration's best caption for
    each alpha, with its score; and alpha changes the winners (a search ignoring it would fail)."""
    tables = TABLES["length_penalty"]
    winners = {}
    for alpha in (0.0, 0.7, 2.0):
        case = CASES[f"length_penalty/{alpha}"]
        assert set(range(V)) - set(case["banned"]) == {EOS, RED, CIRCLE}  # words: red and circle
        found = search(case)
        want = [enumerated_best(tables, b, [RED, CIRCLE], 4, alpha) for b in range(len(tables.attn))]
        assert [hyps[0].tokens for hyps in found] == [tokens for tokens, _ in want], alpha
        assert [hyps[0].score for hyps in found] == pytest.approx([score for _, score in want], abs=1e-4)
        winners[alpha] = [hyps[0].tokens for hyps in found]
    assert winners[0.0] != winners[2.0] and all(len(b) >= len(a) for a, b in zip(winners[0.0], winners[2.0]))


@pytest.mark.parametrize("beam_size", [1, 3])
def test_trigram_blocking_never_repeats_a_trigram(search: Search, beam_size: int) -> None:
    looping = search(CASES[f"trigrams/{beam_size}/looping"])
    assert all(repeats_a_trigram(h.tokens) for hyps in looping for h in hyps[:1])  # red circle red circle ...
    blocked = search(CASES[f"trigrams/{beam_size}/blocked"])
    assert not any(repeats_a_trigram(h.tokens) for hyps in blocked for h in hyps)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_banned_ids_are_never_produced_even_when_most_probable(search: Search, beam_size: int) -> None:
    assert any(RED in h.tokens for hyps in search(CASES[f"banned/{beam_size}/red_allowed"]) for h in hyps)
    case = CASES[f"banned/{beam_size}/red_banned"]
    assert set(case["banned"]) == {PAD, BOS, UNK, RED}
    for hyps in search(case):
        assert all(not {PAD, BOS, UNK, RED} & set(h.tokens) for h in hyps)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_min_length_and_bad_endings_hold_back_the_eos(search: Search, beam_size: int) -> None:
    """The favourite caption is "red a" (two words, ending on an article)."""
    plain = [hyps[0] for hyps in search(CASES[f"min_length/{beam_size}/plain"])]
    assert all(h.tokens == [RED, A] and h.finished for h in plain)
    longer = [h for hyps in search(CASES[f"min_length/{beam_size}/min_4"]) for h in hyps]
    assert all(len(h.tokens) >= 4 for h in longer) and any(h.finished for h in longer)
    good_endings = [h for hyps in search(CASES[f"min_length/{beam_size}/good_endings"]) for h in hyps]
    assert not any(h.finished and h.tokens[-1:] == [A] for h in good_endings) and any(h.finished for h in good_endings)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_bad_ending_holds_back_the_eos_after_the_first_word_too(search: Search, beam_size: int) -> None:
    """The favourite caption is "a" (one word, an article)."""
    assert all(hyps[0].tokens == [A] and hyps[0].finished for hyps in search(CASES[f"first_word/{beam_size}/plain"]))
    good_endings = [h for hyps in search(CASES[f"first_word/{beam_size}/good_endings"]) for h in hyps]
    assert not any(h.finished and h.tokens[-1:] == [A] for h in good_endings)
    assert all(h.tokens[:1] == [A] for h in good_endings[:1])  # it still starts the best caption


@pytest.mark.parametrize("beam_size", [1, 3])
def test_an_image_that_never_ends_is_cut_at_max_length(search: Search, beam_size: int) -> None:
    case = CASES[f"endless/{beam_size}"]
    assert EOS in case["banned"]  # no caption can end
    for hyps in search(case):
        assert len(hyps) == beam_size and len({tuple(h.tokens) for h in hyps}) == beam_size
        assert all(len(h.tokens) == 5 and not h.finished and h.attn.shape[0] == 5 for h in hyps)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


@pytest.mark.parametrize("label", ["greedy", "beam_3", "beam_2_trigrams"])
def test_each_image_of_a_batch_finds_what_it_finds_alone(search: Search, label: str) -> None:
    """Images end at different steps (image 2 never does): the batch's hypotheses are each image's own."""
    case = CASES[f"batch/{label}"]
    together = search(case)
    for b in range(len(together)):
        alone = search(case, images=[b])[0]
        assert [(h.tokens, h.finished) for h in together[b]] == [(h.tokens, h.finished) for h in alone], b
        assert [h.score for h in together[b]] == pytest.approx([h.score for h in alone], abs=1e-5)
        for got, want in zip(together[b], alone):
            np.testing.assert_allclose(got.attn, want.attn, atol=1e-6)
    assert not any(h.finished for h in together[2])
    assert len({len(hyps[0].tokens) for hyps in together}) > 1  # the images end at different steps


@pytest.mark.parametrize("as_beam", [False, True])
def test_the_search_refuses_more_hypotheses_than_beams_in_the_schemas_words(search: Search, as_beam: bool) -> None:
    refusal = next(r for r in FIXTURE["refusals"] if r["search"] == ("beam" if as_beam else "decode"))
    assert re.match(REFUSAL, refusal["error"])  # the words Node's test holds search.js to
    if search is numpy_search:  # the runtime's search takes n_best as an argument, beside its options
        step = lambda memory, prev, state: (np.zeros((len(prev), V), np.float32),  # noqa: E731
                                            np.zeros((len(prev), 1, 1, 1), np.float32), state)
        rules = TokenRules(BOS, EOS, np.zeros(V, bool), np.zeros(V, bool))
        options = SearchOptions(2, 5, 0.0, False, 0, False)
        search_function = numpy_beam_search if as_beam else numpy_decode_hypotheses
        with pytest.raises(ConfigError, match=REFUSAL):
            search_function(step, {"x": np.zeros((1, 1))}, {"s": np.zeros(1)}, rules, options, n_best=3)
        return
    options = DecodeOptions(sample=True, beam_size=2, n_best=3)  # valid for sampling, not for a search
    with pytest.raises(ConfigError, match=REFUSAL):
        feats = torch.zeros(1, 1, 1)
        beam_search_n_best(LookupDecoder(TABLES["greedy"]), feats, SpecialTokens(BOS, EOS, (PAD, BOS, UNK)), options)


# --- diverse groups: the torch search's alone -----------------------------------------------


def test_diverse_groups_give_distinct_best_first_captions_and_one_group_is_plain_search() -> None:
    """The numpy search has no diverse groups (the runtime offers no `diverse_groups`)."""
    case = CASES["diverse/one_group"]
    diverse = torch_search(case, diverse_groups=2, diversity_strength=2.0)
    for hyps in diverse:
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps) >= 2
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    one_group = torch_search(case, diverse_groups=1)
    plain = numpy_search(case)
    assert [[h.tokens for h in hyps] for hyps in one_group] == [[h.tokens for h in hyps] for hyps in plain]


# --- the two searches against each other ----------------------------------------------------


@pytest.mark.parametrize("label", ["greedy", "greedy_rules", "beam_3", "beam_4_alpha", "beam_5_rules", "beam_3_short"])
def test_the_two_searches_find_the_same_captions(label: str) -> None:
    case = CASES[f"agree/{label}"]
    for want, got in zip(torch_search(case), numpy_search(case), strict=True):
        assert [(h.tokens, h.finished) for h in got] == [(h.tokens, h.finished) for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5)
        assert [h.logprob for h in got] == pytest.approx([h.logprob for h in want], abs=1e-5)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.attn, w.attn, atol=1e-6)


# --- the web page's search, through Node ----------------------------------------------------


def test_the_javascript_tests_pass() -> None:
    """`node --test tests/js/`: every Node test of the page (search.js on this file's cases among them)."""
    node = shutil.which("node")
    require(node is not None, "node is not on PATH (the web page's JavaScript tests need Node 20)")
    env = {**os.environ, "NO_COLOR": "1"}
    run = subprocess.run([node, "--test", "tests/js/"], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env=env)
    if run.returncode != 0:
        pytest.fail(f"node --test tests/js/ failed ({run.returncode}):\n{run.stdout[-8000:]}\n{run.stderr[-2000:]}",
                    pytrace=False)
