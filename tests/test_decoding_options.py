"""Decoding options: sampling with gradients (SCST), trigram blocking, diverse beam search,
n-best output, top-k / nucleus sampling, and live-vs-finished beams at max_length."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from helpers import tiny_model
from PIL import Image

from captioner.apps.cli import main
from captioner.core.config_sections import DecodeConfig
from captioner.core.errors import ConfigError
from captioner.evaluation.caption_stats import caption_stats, ends_badly, repeats_bigram
from captioner.evaluation.metrics import nltk_corpus_bleu, tokenized
from captioner.models.checkpoint import save_checkpoint
from captioner.models.decoder import Decoder
from captioner.models.decoding import (DecodeOptions, SpecialTokens, beam_search, beam_search_n_best, greedy_decode,
                                       sample_n_best)
from captioner.models.decoding.rules import banned_mask, block_repeated_trigrams
from captioner.models.decoding.sampling import restrict_to_top, sample_captions, scored_by_teacher_forcing

BOS, EOS = 1, 2
BANNED = (0, 1, 3)  # <pad>, <bos>, <unk>
SPECIAL = SpecialTokens(BOS, EOS, BANNED)


@pytest.fixture(params=["lstm", "transformer"])
def decoder(request: pytest.FixtureRequest) -> Decoder:
    return tiny_model(f"model.decoder.type={request.param}").decoder


def teacher_forced_logprob(decoder: Decoder, feats: torch.Tensor, tokens: torch.Tensor,
                           mask: torch.Tensor) -> torch.Tensor:
    """(R,) log-probability of each padded row of tokens (R, T) under teacher forcing, masked positions only."""
    inputs = torch.cat([torch.full_like(tokens[:, :1], BOS), tokens[:, :-1]], dim=1)  # (R, T): <bos> + prefix
    logprobs = decoder(feats, inputs).logits.log_softmax(-1)  # (R, T, V)
    return (logprobs.gather(2, tokens[:, :, None]).squeeze(2) * mask).sum(dim=1)  # (R,)


def test_sampled_logprobs_equal_teacher_forcing_and_masks_are_consistent(decoder: Decoder) -> None:
    torch.manual_seed(1)
    feats = torch.randn(3, 16, decoder_feat_dim(decoder))
    out = sample_captions(decoder, feats, SPECIAL, DecodeOptions(sample=True, n_best=4, max_length=12, seed=0))
    R, T = out.tokens.shape
    assert R == 12 and out.logprobs.shape == out.mask.shape == (R, T)
    assert out.image_rows.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert not any(int(t) in BANNED for t in out.tokens[out.mask])  # never <pad>, <bos>, <unk>
    assert (out.tokens[~out.mask] == 0).all() and (out.logprobs[~out.mask] == 0).all()
    assert out.lengths.tolist() == out.mask.sum(1).tolist()
    for row, length in zip(out.tokens, out.lengths.tolist()):
        assert (row[:length] == EOS).sum() <= 1  # at most one <eos>, and only as the last true position
        if length < T or row[length - 1] == EOS:
            assert row[length - 1] == EOS and (row[: length - 1] != EOS).all()
    assert (out.mask[:, :-1] | ~out.mask[:, 1:]).all()  # true positions form a prefix
    expected = teacher_forced_logprob(decoder, feats.index_select(0, out.image_rows), out.tokens, out.mask)
    torch.testing.assert_close(out.caption_logprobs(), expected, atol=1e-5, rtol=1e-5)



def test_scoring_the_samples_by_teacher_forcing_gives_the_roll_outs_numbers_and_gradients(decoder: Decoder) -> None:
    """SCST on the CPU samples without gradients and scores the samples in one teacher-forced
    pass: each caption's log-probability and every gradient equal those the roll-out records
    step by step, for captions that end at different steps and some that never end."""
    torch.manual_seed(2)
    feats = torch.randn(3, 16, decoder_feat_dim(decoder), requires_grad=True)
    out_layer = decoder.out_vocab if hasattr(decoder, "out_vocab") else decoder.out
    with torch.no_grad():
        out_layer.bias[EOS] += 1.0  # <eos> likely enough that the captions end at many different steps
    options = DecodeOptions(sample=True, n_best=5, max_length=9, temperature=0.8, seed=0)
    samples = sample_captions(decoder, feats, SPECIAL, options)
    assert len(set(samples.lengths.tolist())) >= 4 and samples.lengths.max() == 9
    weights = torch.linspace(-1, 1, samples.lengths.numel())  # (R,): an advantage per sample

    def gradients(logprobs: torch.Tensor) -> list[torch.Tensor]:
        decoder.zero_grad()
        feats.grad = None
        (weights * logprobs).sum().backward(retain_graph=True)
        return [p.grad.clone() for p in decoder.parameters() if p.grad is not None] + [feats.grad.clone()]

    scored = scored_by_teacher_forcing(decoder, feats, samples, BOS)
    torch.testing.assert_close(scored, samples.caption_logprobs(), atol=1e-5, rtol=1e-5)
    for got, want in zip(gradients(scored), gradients(samples.caption_logprobs()), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)

def test_sampled_logprobs_are_the_models_whatever_the_sampling_restrictions(decoder: Decoder) -> None:
    """Temperature, top-k, top-p and trigram blocking change what is drawn, not the recorded
    log-probability: it stays the model's own (temperature 1), as the policy gradient needs."""
    feats = torch.randn(2, 16, decoder_feat_dim(decoder))
    options = DecodeOptions(
        sample=True, n_best=3, max_length=10, temperature=0.5, top_k=5, top_p=0.8, block_trigrams=True, seed=0
    )
    out = sample_captions(decoder, feats, SPECIAL, options)
    expected = teacher_forced_logprob(decoder, feats.index_select(0, out.image_rows), out.tokens, out.mask)
    torch.testing.assert_close(out.caption_logprobs(), expected, atol=1e-5, rtol=1e-5)


def decoder_feat_dim(decoder: Decoder) -> int:
    if hasattr(decoder, "grid_proj"):
        return decoder.grid_proj[0].in_features
    return decoder.init_h.in_features


def test_sampling_has_gradients_in_train_mode(decoder: Decoder) -> None:
    decoder.train()  # dropout on, as in SCST
    feats = torch.randn(2, 16, decoder_feat_dim(decoder))
    out = sample_captions(decoder, feats, SPECIAL, DecodeOptions(sample=True, n_best=3, max_length=8))
    assert out.logprobs.requires_grad
    decoder.zero_grad()
    (-out.caption_logprobs().sum()).backward()
    grads = [p.grad.abs().sum() for p in decoder.parameters() if p.grad is not None]
    assert grads and float(sum(grads)) > 0


def test_sampling_under_autocast(decoder: Decoder) -> None:
    feats = torch.randn(2, 16, decoder_feat_dim(decoder))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sample_captions(decoder, feats, SPECIAL, DecodeOptions(sample=True, n_best=2, max_length=6))
    assert out.logprobs.dtype == torch.float32 and torch.isfinite(out.logprobs).all()
    out.caption_logprobs().sum().backward()


def test_seeded_sampling_reproduces(decoder: Decoder) -> None:
    feats = torch.randn(2, 16, decoder_feat_dim(decoder))
    runs = [
        sample_captions(decoder, feats, SPECIAL, DecodeOptions(sample=True, n_best=5, max_length=10, seed=7))
        for _ in range(2)
    ]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    other = sample_captions(decoder, feats, SPECIAL, DecodeOptions(sample=True, n_best=5, max_length=10, seed=8))
    assert not torch.equal(runs[0].tokens, other.tokens)


# --- decoders rigged for the tests -------------------------------------------------------------


class TableDecoder(Decoder):
    """Log-probabilities from a fixed table, one row per step (the last repeats), whatever the
    previous words; uniform attention. Makes the best sequences known in advance."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table.log_softmax(dim=-1)  # (T, V)
        self.vocab_size = table.shape[1]

    def prepare(self, feats: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"feats": feats}

    def init_state(self, memory: dict[str, torch.Tensor], capacity: int | None = None) -> dict[str, torch.Tensor]:
        return {"pos": torch.zeros(memory["feats"].shape[0], dtype=torch.long)}

    def step(self, memory, prev_tokens, state):
        pos = state["pos"].clamp(max=self.table.shape[0] - 1)  # (B,)
        B, N = memory["feats"].shape[:2]
        return self.table[pos], torch.full((B, 1, 1, N), 1.0 / N), {"pos": state["pos"] + 1}


def probabilities(*rows: dict[int, float], vocab: int = 8) -> torch.Tensor:
    """(T, V) logits whose softmax puts the given probability on the given ids (the rest share
    what is left, or get ~0)."""
    table = torch.full((len(rows), vocab), 1e-9)
    for t, row in enumerate(rows):
        for i, p in row.items():
            table[t, i] = p
    return table.log()


def repetitive(kind: str) -> Decoder:
    """A real decoder whose output bias makes words 4 and 5 overwhelmingly likely and <eos> nearly
    impossible: every long enough caption it writes repeats a trigram (only 8 exist over 2 words)."""
    decoder = tiny_model(f"model.decoder.type={kind}").decoder
    out = decoder.out if kind == "transformer" else decoder.out_vocab
    with torch.no_grad():
        out.bias.zero_()
        out.bias[[4, 5]] = 10.0
        out.bias[EOS] = -30.0
    return decoder


def repeated_trigram(tokens: list[int]) -> bool:
    trigrams = list(zip(tokens, tokens[1:], tokens[2:]))
    return len(trigrams) != len(set(trigrams))


# --- trigram blocking ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
@pytest.mark.parametrize("method", ["beam", "greedy", "sample"])
def test_trigram_blocking_never_repeats_a_trigram(kind: str, method: str) -> None:
    decoder = repetitive(kind)
    feats = torch.randn(3, 16, decoder_feat_dim(decoder))

    def captions(block: bool) -> list[list[int]]:
        if method == "beam":
            options = DecodeOptions(beam_size=3, max_length=14, block_trigrams=block)
            return [h.tokens for h in beam_search(decoder, feats, SPECIAL, options)]
        if method == "greedy":
            return [h.tokens
                    for h in greedy_decode(decoder, feats, SPECIAL, DecodeOptions(max_length=14, block_trigrams=block))]
        options = DecodeOptions(sample=True, n_best=4, max_length=14, block_trigrams=block, seed=0)
        out = sample_captions(decoder, feats, SPECIAL, options)
        return [row[mask].tolist() for row, mask in zip(out.tokens, out.mask)]

    assert any(repeated_trigram(c) for c in captions(False))  # the rig works: it loves repetition
    blocked = captions(True)
    assert all(len(c) == 14 for c in blocked)  # still no <eos>: blocking removed only repeats
    assert not any(repeated_trigram(c) for c in blocked)


def test_block_repeated_trigrams_forbids_exactly_the_repeating_words() -> None:
    history = torch.tensor([[4, 5, 6, 4, 5], [4, 4, 4, 4, 7], [4, 5, 6, 7, 8]])  # (3, 5)
    blocked = torch.isinf(block_repeated_trigrams(torch.zeros(3, 10), history))  # (3, 10)
    assert blocked[0].nonzero().flatten().tolist() == [6]  # (4, 5) was followed by 6
    assert blocked[1].nonzero().flatten().tolist() == []  # (4, 7) never seen before
    assert blocked[2].nonzero().flatten().tolist() == []
    history = torch.tensor([[4, 4, 4, 4]])  # (4, 4) was followed by 4: a fourth 4 would repeat (4, 4, 4)
    assert torch.isinf(block_repeated_trigrams(torch.zeros(1, 10), history)).nonzero()[:, 1].tolist() == [4]


# --- diverse beam search and n-best -------------------------------------------------------------


def test_diverse_beam_groups_differ() -> None:
    """Word 4 dominates the first step: plain beam search (4 beams) starts every hypothesis with
    it. With 2 groups of 2, group 0 keeps beams "4" and "5" at step 1 and ends with two captions
    starting with 4; the penalty pushes group 1 off both words, to "6" and "7", and its best two
    start with 6."""
    table = probabilities({4: 0.6, 5: 0.2, 6: 0.15, 7: 0.05}, {4: 0.25, 5: 0.25, 6: 0.25, 7: 0.25}, {EOS: 1.0})
    decoder, feats = TableDecoder(table), torch.randn(2, 4, 3)
    plain = beam_search_n_best(decoder, feats, SPECIAL, DecodeOptions(beam_size=4, max_length=5, n_best=4))
    diverse = beam_search_n_best(
        decoder, feats, SPECIAL,
        DecodeOptions(beam_size=4, max_length=5, diverse_groups=2, diversity_strength=5.0, n_best=4)
    )
    for hyps in plain:
        assert {h.tokens[0] for h in hyps} == {4}
    for hyps in diverse:
        assert len({tuple(h.tokens) for h in hyps}) == 4
        assert sorted(h.tokens[0] for h in hyps) == [4, 4, 6, 6]  # group 1 avoided group 0's words
        assert all(h.finished and h.tokens[1] in (4, 5, 6, 7) for h in hyps)
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        for h in hyps:  # the penalty steers the choice, never the score: it stays the log-probability
            expected = float(decoder.table[0, h.tokens[0]] + decoder.table[1, h.tokens[1]] + decoder.table[2, EOS])
            assert h.logprob == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_one_group_is_plain_beam_search_and_groups_run_on_real_decoders(kind: str) -> None:
    decoder = tiny_model(f"model.decoder.type={kind}").decoder
    feats = torch.randn(3, 16, decoder_feat_dim(decoder))
    plain = beam_search(decoder, feats, SPECIAL, DecodeOptions(beam_size=4, max_length=10))
    one_group = beam_search(decoder, feats, SPECIAL,
                            DecodeOptions(beam_size=4, max_length=10, diverse_groups=1, diversity_strength=3.0))
    assert [h.tokens for h in plain] == [h.tokens for h in one_group]
    options = DecodeOptions(beam_size=4, max_length=10, diverse_groups=4, diversity_strength=3.0, n_best=4)
    diverse = beam_search_n_best(decoder, feats, SPECIAL, options)
    for hyps in diverse:  # four groups of one beam each, each pushed off the others' words
        assert len({h.tokens[0] for h in hyps if h.tokens}) >= 2


def test_beam_search_refuses_a_vocabulary_its_float32_read_cannot_hold() -> None:
    """Each step reads its word ids back as float32 (one read, no conversion kernels), exact below 2**24."""

    class Huge:
        vocab_size = 2**24

    with pytest.raises(ValueError, match="under 2\\*\\*24 words"):
        beam_search_n_best(Huge(), torch.zeros(1, 4, 8), SPECIAL,  # type: ignore[arg-type]
                           DecodeOptions(beam_size=2, max_length=3))


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_n_best_gives_distinct_sorted_hypotheses_with_attention(kind: str) -> None:
    model = tiny_model(f"model.decoder.type={kind}")
    images = torch.randn(2, 3, 32, 32)
    feats, grid = model.encode(images)
    n_best = model.decode(feats, grid, n_best=3, beam_size=4, max_length=8)
    best = model.decode(feats, grid, beam_size=4, max_length=8)
    layers = model.config.decoder.num_layers if kind == "transformer" else 1
    heads = model.config.decoder.num_heads if kind == "transformer" else 1
    for captions, first in zip(n_best, best):
        assert len(captions) == 3 and len({tuple(c.tokens) for c in captions}) == 3
        assert [c.score for c in captions] == sorted((c.score for c in captions), reverse=True)
        assert captions[0].tokens == first.tokens  # the default API returns the best of them
        for c in captions:
            assert c.attn.shape == (len(c.tokens), layers, heads, *grid)
    with pytest.raises(ConfigError, match="n_best"):
        model.decode(feats, grid, n_best=5, beam_size=4)
    with pytest.raises(ConfigError, match="diverse_groups"):
        model.decode(feats, grid, beam_size=3, diverse_groups=2)


# --- DecodeOptions: one place for defaults and checks ------------------------------------------


def test_options_default_to_the_config_and_take_overrides_by_name() -> None:
    assert DecodeOptions.from_config(DecodeConfig()) == DecodeOptions()  # the config's defaults are the options'
    config = DecodeConfig(beam_size=4, max_length=9, length_penalty=0.6, block_trigrams=True, diverse_groups=2)
    options = DecodeOptions.from_config(config, max_length=5, n_best=3, seed=None)
    assert (options.beam_size, options.max_length, options.length_penalty, options.block_trigrams) == (4, 5, 0.6, True)
    assert (options.diverse_groups, options.n_best, options.seed, options.sample) == (2, 3, None, False)
    assert DecodeOptions.from_config(config, beam_size=None).beam_size == 4  # None keeps the configured value


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"beam": 3}, r"^decode: unknown option 'beam' \(did you mean 'beam_size'\?\)$"),
        ({"colour": "red"}, r"^decode: unknown option 'colour' \(options: beam_size, max_length, .*self_attention\)$"),
        ({"beam_size": "3"}, r"^decode: beam_size must be a whole number in \[1, 100\]; got '3'$"),
        ({"block_trigrams": 1}, r"^decode: block_trigrams must be true or false; got 1$"),
        ({"top_p": "high", "sample": True}, r"^decode: top_p must be a finite number in \(0, 1\]; got 'high'$"),
        ({"diversity_strength": float("nan")}, r"^decode: diversity_strength must be a finite number >= 0; got nan$"),
        ({"n_best": 0}, r"^decode: n_best must be a whole number in \[1, 100\]; got 0$"),
        ({"max_length": 0}, r"^decode: max_length must be a whole number in \[1, 1000\]; got 0$"),
        ({"diverse_groups": 2}, r"^decode: beam_size \(3\) must be a multiple of diverse_groups \(2\)$"),
        ({"diversity_strength": -1.0}, r"^decode: diversity_strength must be a finite number >= 0; got -1.0$"),
        ({"n_best": 4}, r"^decode: n_best \(4\) must not exceed beam_size \(3\); raise the beam or sample$"),
        ({"sample": True, "temperature": 0.0}, r"^decode: temperature must be a finite number > 0; got 0.0$"),
        ({"sample": True, "top_k": -1}, r"^decode: top_k must be a whole number >= 0; got -1$"),
        ({"sample": True, "top_p": 1.5}, r"^decode: top_p must be a finite number in \(0, 1\]; got 1.5$"),
    ],
)
def test_a_bad_option_is_a_one_line_error_naming_it(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DecodeOptions.from_config(DecodeConfig(), **overrides)


def test_every_value_is_judged_alone_and_the_rules_between_options_only_where_they_apply() -> None:
    with pytest.raises(ConfigError, match="temperature"):  # a temperature of 0 is wrong whether or not it is used
        DecodeOptions(temperature=0.0)
    DecodeOptions(sample=True, beam_size=3, diverse_groups=2, n_best=8)  # sampling: n_best draws, no beam to divide


@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_greedy_decoding_never_samples(kind: str) -> None:
    """Sampling is its own function: greedy decoding takes the argmax whatever the sampling options say."""
    decoder = tiny_model(f"model.decoder.type={kind}").decoder.eval()
    feats = torch.randn(4, 16, decoder_feat_dim(decoder))
    greedy = greedy_decode(decoder, feats, SPECIAL, DecodeOptions(max_length=8))
    hot = greedy_decode(decoder, feats, SPECIAL, DecodeOptions(max_length=8, sample=True, temperature=50.0, seed=1))
    assert [h.tokens for h in hot] == [h.tokens for h in greedy]
    drawn = sample_n_best(decoder, feats, SPECIAL, DecodeOptions(max_length=8, sample=True, temperature=50.0, seed=1))
    assert [hyps[0].tokens for hyps in drawn] != [h.tokens for h in greedy]  # the same options do sample there


def test_sample_n_best_draws_n_per_image_most_probable_first() -> None:
    decoder = tiny_model().decoder.eval()
    feats = torch.randn(3, 16, decoder_feat_dim(decoder))
    options = DecodeOptions(sample=True, n_best=5, max_length=6, temperature=2.0, seed=4)
    ranked = sample_n_best(decoder, feats, SPECIAL, options)
    assert [len(hyps) for hyps in ranked] == [5, 5, 5]
    for hyps in ranked:
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    assert [[h.tokens for h in hyps] for hyps in sample_n_best(decoder, feats, SPECIAL, options)] == [
        [h.tokens for h in hyps] for hyps in ranked
    ]  # seeded: the same draws again


def test_the_model_builds_its_options_from_its_config_and_refuses_unknown_ones() -> None:
    model = tiny_model("decode.beam_size=4", "decode.max_length=7")
    assert model.decode_options() == DecodeOptions(beam_size=4, max_length=7)
    assert model.decode_options(beam_size=2, sample=None) == DecodeOptions(beam_size=2, max_length=7)
    feats, grid = model.encode(torch.randn(1, 3, 32, 32))
    with pytest.raises(ConfigError, match=r"^decode: unknown option 'beams' \(did you mean 'beam_size'\?\)$"):
        model.decode(feats, grid, beams=3)
    assert len(model.decode(feats, grid)[0].tokens) <= 7  # the config's max_length reaches the search


# --- max_length: live beams compete with finished ones -------------------------------------------


@pytest.mark.parametrize("groups", [1, 2])
def test_live_beam_beats_a_worse_finished_one_at_max_length(groups: int) -> None:
    """After word 1, <eos> is possible but unlikely (p = 0.1); continuing is almost certain. At
    max_length the never-ended beam "4 4 4 4 4" (log-prob ~ -0.1) beats the finished "4"
    (log-prob ~ -2.3), and is returned, unfinished."""
    table = probabilities({4: 1.0}, {4: 0.9, EOS: 0.1}, {4: 0.9999, EOS: 1e-6})
    decoder, feats = TableDecoder(table), torch.randn(3, 4, 3)
    for alpha in (0.0, 1.0):
        hyps = beam_search(decoder, feats, SPECIAL,
                           DecodeOptions(beam_size=2, max_length=5, length_penalty=alpha, diverse_groups=groups))
        for h in hyps:
            assert h.tokens == [4] * 5 and not h.finished
            assert h.logprob == pytest.approx(float(decoder.table[1, 4] + 3 * decoder.table[2, 4]), abs=1e-5)
    if groups == 1:  # (with one beam per group, <eos> never ranks within a group's top 1 here)
        ranked = beam_search_n_best(decoder, feats, SPECIAL, DecodeOptions(beam_size=2, max_length=5, n_best=2))
        # the finished one, second
        assert [(h.tokens, h.finished) for h in ranked[0]] == [([4] * 5, False), ([4], True)]


def test_finished_beam_wins_when_it_is_better() -> None:
    table = probabilities({4: 1.0}, {4: 0.1, EOS: 0.9}, {4: 0.5, EOS: 0.5})
    hyps = beam_search(TableDecoder(table), torch.randn(2, 4, 3), SPECIAL, DecodeOptions(beam_size=2, max_length=5))
    assert all(h.tokens == [4] and h.finished for h in hyps)


# --- top-k and nucleus sampling ----------------------------------------------------------------


def test_top_k_never_leaves_the_k_best() -> None:
    torch.manual_seed(0)
    table = torch.randn(6, 12)
    decoder, feats = TableDecoder(table), torch.randn(4, 4, 3)
    out = sample_captions(decoder, feats, SPECIAL, DecodeOptions(sample=True, n_best=50, max_length=6, top_k=3, seed=0))
    allowed = decoder.table.masked_fill(banned_mask(BANNED, decoder.vocab_size, "cpu"), float("-inf"))  # (6, V)
    for t in range(out.tokens.shape[1]):
        top3 = set(allowed[t].topk(3).indices.tolist())
        drawn = set(out.tokens[out.mask[:, t], t].tolist())
        assert drawn <= top3 and len(drawn) > 1  # within the k best, and really sampled


def test_top_p_never_leaves_the_nucleus() -> None:
    table = probabilities({4: 0.5, 5: 0.3, 6: 0.15, 7: 0.05}, vocab=8)
    decoder, feats = TableDecoder(table), torch.randn(200, 4, 3)
    ranked = sample_n_best(decoder, feats, SPECIAL, DecodeOptions(sample=True, max_length=3, top_p=0.7, seed=0))
    words = {w for hyps in ranked for h in hyps for w in h.tokens}
    assert words == {4, 5}  # 0.5 < 0.7 needs the second word (mass 0.8); 6 and 7 lie outside
    ranked = sample_n_best(decoder, feats, SPECIAL, DecodeOptions(sample=True, max_length=3, top_p=0.81, seed=0))
    assert {w for hyps in ranked for h in hyps for w in h.tokens} == {4, 5, 6}


def test_restrict_to_top_keeps_at_least_one_word() -> None:
    logits = torch.tensor([[3.0, 1.0, 0.0, -1.0]])
    assert torch.isfinite(restrict_to_top(logits, top_p=0.01)).tolist() == [[True, False, False, False]]
    assert torch.isfinite(restrict_to_top(logits, top_k=2)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(restrict_to_top(logits, top_k=3, top_p=0.999)).sum() == 3


# --- evaluation: tutorial-style BLEU and caption statistics ------------------------------------

BLEU_REFERENCES = {
    1: ["a dog runs on the grass", "the brown dog is running very fast"],
    2: ["a red car parked outside", "a car on the street"],
}
BLEU_PREDICTIONS = {1: "a dog a dog runs", 2: "a red car parked"}


def test_nltk_corpus_bleu_on_a_fixture_computed_by_hand() -> None:
    """Clipped n-gram matches, summed over the corpus:
    image 1, "a dog a dog runs" (5 words) against "a dog runs on the grass" / "the brown dog is
      running very fast": unigrams a x2 (clipped to 1), dog x2 (clipped to 1), runs -> 3 of 5;
      bigrams (a dog) x2 -> 1, (dog a) 0, (dog runs) 1 -> 2 of 4; trigrams only (a dog runs)
      -> 1 of 3; 4-grams 0 of 2. Closest reference length: 6 (the other is 7).
    image 2, "a red car parked" (4) against "a red car parked outside" / "a car on the street":
      4 of 4, 3 of 3, 2 of 2, 1 of 1. Closest reference length 5.
    p1 = 7/9, p2 = 5/7, p3 = 3/5, p4 = 1/3; c = 9, r = 11, BP = exp(1 - 11/9).
    BLEU-4 = BP * (7/9 * 5/7 * 3/5 * 1/3) ** (1/4) = BP * (1/9) ** (1/4) = BP / sqrt(3).
    """
    refs, preds = tokenized(BLEU_REFERENCES, BLEU_PREDICTIONS, ptb=False)
    scores = nltk_corpus_bleu(refs, preds)
    bp = math.exp(1 - 11 / 9)
    assert scores["nltk_corpus_BLEU_1"] == pytest.approx(bp * 7 / 9, abs=1e-12)
    assert scores["nltk_corpus_BLEU_2"] == pytest.approx(bp * math.sqrt(5 / 9), abs=1e-12)
    assert scores["nltk_corpus_BLEU_3"] == pytest.approx(bp * (7 / 9 * 5 / 7 * 3 / 5) ** (1 / 3), abs=1e-12)
    assert scores["nltk_corpus_BLEU_4"] == pytest.approx(bp / math.sqrt(3), abs=1e-12)  # 0.46231
    # On the same tokens pycocoevalcap's BLEU is the same formula up to its smoothing constants.
    from pycocoevalcap.bleu.bleu import Bleu

    official, _ = Bleu(4).compute_score({i: [" ".join(r) for r in refs[i]] for i in refs},
                                        {i: [" ".join(p)] for i, p in preds.items()}, verbose=0)
    assert official == pytest.approx(list(scores.values()), abs=1e-6)
    # No 4-gram match anywhere: nltk (no smoothing, as the tutorial calls it) gives ~0.
    assert nltk_corpus_bleu(refs, {1: ["a", "dog", "a", "dog"], 2: ["car", "a", "red"]})["nltk_corpus_BLEU_4"] < 1e-100


def test_caption_statistics() -> None:
    assert ends_badly("a man riding a horse with a") and ends_badly(["dogs", "playing", "in", "the"])
    assert ends_badly("a plate of food and")
    assert not ends_badly("a man looking up") and not ends_badly("a dog lying down.") and not ends_badly("")
    assert repeats_bigram("a dog and a dog") and not repeats_bigram("a dog and a cat on a mat")
    stats = caption_stats(["a dog on a dog", "a cat on the", "two birds", "a man with a hat with a"])
    assert stats == {"bad_ending_rate": 0.5, "repeated_bigram_rate": 0.5, "mean_length": 4.5}


def test_evaluate_reports_tutorial_bleu_and_caption_stats(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    annotations = tmp_path / "captions.json"
    annotations.write_text(json.dumps({
        "images": [{"id": i} for i in BLEU_REFERENCES],
        "annotations": [{"id": 10 * i + k, "image_id": i, "caption": c} for i, refs in BLEU_REFERENCES.items() for k,
                        c in enumerate(refs)],
    }))
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": i, "caption": c} for i, c in BLEU_PREDICTIONS.items()]))
    assert main(["evaluate", "--results", str(results), "--annotations", str(annotations), "--fast", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tutorial_bleu"]["nltk_corpus_BLEU_4"] == pytest.approx(0.4623, abs=1e-4)
    assert "not comparable" in report["tutorial_bleu"]["label"]
    assert report["caption_stats"] == {"bad_ending_rate": 0.0, "repeated_bigram_rate": 0.5, "mean_length": 4.5}
    assert main(["evaluate", "--results", str(results), "--annotations", str(annotations), "--fast"]) == 0
    printed = capsys.readouterr().out
    # another BLEU: a diagnostic, for -v
    assert "repeated bigrams 50.0%" in printed and "nltk_corpus_BLEU_4" not in printed
    assert main(["evaluate", "--results", str(results), "--annotations", str(annotations), "--fast", "-v"]) == 0
    assert "nltk_corpus_BLEU_4 0.4623" in capsys.readouterr().out


# --- the CLI on a tiny checkpoint --------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint_and_images(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """An untrained tiny LSTM checkpoint (what is decoded does not matter here, only how) and
    two images."""
    root = tmp_path_factory.mktemp("cli")
    save_checkpoint(root / "tiny.pt", tiny_model())
    images = []
    for i, colour in enumerate(("red", "blue")):
        path = root / f"image{i}.png"
        Image.new("RGB", (40, 40), colour).save(path)
        images.append(path)
    return root / "tiny.pt", images


def test_cli_n_best_json_with_heatmaps(checkpoint_and_images, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    checkpoint, images = checkpoint_and_images
    args = ["caption", str(checkpoint), *map(str, images), "--beam", "4", "--max-length", "6"]
    assert main([*args, "--n-best", "3", "--json", "--attention", "--heatmaps", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["image"] for r in rows] == list(map(str, images))
    for row in rows:
        hyps = row["n_best"]
        assert len(hyps) == 3 and len({h["caption"] for h in hyps}) == 3
        assert [h["score"] for h in hyps] == sorted((h["score"] for h in hyps), reverse=True)
        assert row["caption"] == hyps[0]["caption"]
        for rank, h in enumerate(hyps, start=1):
            assert Path(h["heatmaps"]).name.endswith(f"_attention_{rank}.png") and Path(h["heatmaps"]).is_file()
            assert len(h["attention"]) == len(h["caption"].split())  # one h x w map per word
    assert main([*args, "--n-best", "5"]) == 2  # more than the beam: a one-line error
    assert "n_best (5) must not exceed beam_size (4)" in capsys.readouterr().err


def test_cli_nucleus_sampling_is_seeded(checkpoint_and_images, capsys: pytest.CaptureFixture) -> None:
    checkpoint, images = checkpoint_and_images
    args = ["caption", str(checkpoint), *map(str, images), "--sample", "--top-p", "0.9", "--seed", "3", "--json"]
    outputs = []
    for _ in range(2):
        assert main(args) == 0
        outputs.append(json.loads(capsys.readouterr().out))
    assert outputs[0] == outputs[1] and len(outputs[0]) == 2 and "n_best" not in outputs[0][0]
    assert main([*args, "--n-best", "4"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(len(r["n_best"]) == 4 for r in rows)
    assert main(["caption", str(checkpoint), str(images[0]), "--top-k", "5"]) == 2
    assert "only with --sample" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # argparse refuses the flag's value with the options' own text
        main(["caption", str(checkpoint), str(images[0]), "--sample", "--top-p", "1.5"])
    assert refused.value.code == 2
    assert "argument --top-p: top_p must be a finite number in (0, 1]; got 1.5" in capsys.readouterr().err


def test_cli_block_trigrams_and_diverse_groups(checkpoint_and_images, capsys: pytest.CaptureFixture) -> None:
    checkpoint, images = checkpoint_and_images
    args = ["caption", str(checkpoint), *map(str, images), "--beam", "4", "--max-length", "12", "--json"]
    assert main([*args, "--block-trigrams", "--diverse-groups", "2", "--diversity-strength", "1.0"]) == 0
    for row in json.loads(capsys.readouterr().out):
        assert not repeated_trigram(row["caption"].split())
    assert main([*args, "--diverse-groups", "3"]) == 2
    assert "multiple of diverse_groups" in capsys.readouterr().err


def test_tutorial_bleu_tokens_are_the_official_scorers() -> None:
    """With the official metrics, nltk BLEU scores the Java PTB tokenizer's tokens."""
    refs, preds = tokenized({1: ["A dog, running.", "the dog's ball"]}, {1: "A red car; parked."}, ptb=True)
    assert refs == {1: [["a", "dog", "running"], ["the", "dog", "'s", "ball"]]} and preds == {
        1: ["a", "red", "car", "parked"]}


def test_beam_wider_than_the_vocabulary_never_keeps_an_eos_as_a_live_beam() -> None:
    """One real word and <eos>: most of the 2K candidates are dead fillers, and an <eos> must
    never be carried on as a live beam (its words would contain <eos>)."""
    table = probabilities({4: 0.6, EOS: 0.4}, vocab=5)
    for groups in (1, 3):
        options = DecodeOptions(beam_size=3, max_length=4, diverse_groups=groups, n_best=3)
        ranked = beam_search_n_best(TableDecoder(table), torch.randn(2, 4, 3), SPECIAL, options)
        for hyps in ranked:
            assert all(EOS not in h.tokens and math.isfinite(h.score) for h in hyps)
            if groups == 1:  # 0.4 > 0.6*0.4 > 0.6^2*0.4 > 0.6^4 (cut off at max_length)
                assert [h.tokens for h in hyps] == [[], [4], [4, 4]]
