"""The LSTM decoder and decoding: forward/step parity, greedy vs beam, attention, batching."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_model
from beam_enumeration import assert_beam_ranks_by_length_penalty

from captioner.models import attention as attention_module
from captioner.models.decoding import DecodeOptions, SpecialTokens, beam_search, greedy_decode, sample_n_best
from captioner.models.decoders.lstm import LSTMConfig, LSTMDecoder


SPECIAL = SpecialTokens(bos=1, eos=2)


@pytest.fixture
def decoder() -> LSTMDecoder:
    torch.manual_seed(0)
    return LSTMDecoder(LSTMConfig(embed_dim=8, hidden_dim=12, attention_dim=6, dropout=0.3), 20, 10).eval()


def test_forward_matches_step(decoder: LSTMDecoder) -> None:
    """Teacher-forced logits at position t equal the log-probs after t+1 calls of step."""
    feats = torch.randn(3, 7, 10)
    tokens = torch.randint(0, 20, (3, 6))
    out = decoder(feats, tokens)
    memory = decoder.prepare(feats)
    state = decoder.init_state(memory)
    for t in range(tokens.shape[1]):
        logprobs, attn, state = decoder.step(memory, tokens[:, t], state)
        torch.testing.assert_close(logprobs, out.logits[:, t].log_softmax(-1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(attn, out.attn[:, t], atol=1e-6, rtol=1e-6)


def test_attention_is_a_distribution_over_the_grid(decoder: LSTMDecoder) -> None:
    out = decoder(torch.randn(2, 9, 10), torch.randint(0, 20, (2, 5)))
    assert out.logits.shape == (2, 5, 20) and out.attn.shape == (2, 5, 1, 1, 9)
    assert (out.attn >= 0).all()
    torch.testing.assert_close(out.attn.sum(-1), torch.ones(2, 5, 1, 1))


def test_grid_projection_is_computed_once_per_image(decoder: LSTMDecoder) -> None:
    calls = []
    decoder.attention.feat_proj.register_forward_pre_hook(lambda layer, inputs: calls.append(inputs[0].shape))  # W_h
    decoder(torch.randn(2, 9, 10), torch.randint(0, 20, (2, 8)))
    beam_search(decoder, torch.randn(2, 9, 10), SPECIAL, DecodeOptions(beam_size=3, max_length=8))
    assert calls == [(2, 9, 10), (2, 9, 10)]  # once per batch of images, not per step or per beam


def test_attention_penalty() -> None:
    decoder = LSTMDecoder(LSTMConfig(embed_dim=4, hidden_dim=4, attention_dim=4), 10, 4)
    attn = torch.zeros(1, 4, 1, 1, 4)
    attn[0, torch.arange(4), 0, 0, torch.arange(4)] = 1.0  # each cell attended exactly once
    mask = torch.ones(1, 4, dtype=torch.bool)
    assert float(decoder.attention_penalty(attn, mask)) == 0.0
    attn_same = torch.zeros(1, 4, 1, 1, 4)
    attn_same[..., 0] = 1.0  # always the same cell: coverage (4, 0, 0, 0)
    assert float(decoder.attention_penalty(attn_same, mask)) == pytest.approx((9 + 1 + 1 + 1) / 4)
    mask[0, 2:] = False  # padded steps do not count: coverage (2, 0, 0, 0)
    assert float(decoder.attention_penalty(attn_same, mask)) == pytest.approx((1 + 1 + 1 + 1) / 4)


def test_beam_one_equals_greedy(decoder: LSTMDecoder) -> None:
    feats = torch.randn(5, 7, 10)
    greedy = greedy_decode(decoder, feats, SPECIAL, DecodeOptions(max_length=12))
    beam = beam_search(decoder, feats, SPECIAL, DecodeOptions(beam_size=1, max_length=12))
    for g, b in zip(greedy, beam):
        assert g.tokens == b.tokens
        assert g.logprob == pytest.approx(b.logprob, abs=1e-4)
        torch.testing.assert_close(g.attn, b.attn)


def sequence_logprob(decoder: LSTMDecoder, feats: torch.Tensor, tokens: list[int], eos: int | None) -> float:
    ids = [1, *tokens] + ([eos] if eos is not None else [])
    inputs = torch.tensor([ids[:-1]])
    logprobs = decoder(feats[None], inputs).logits.log_softmax(-1)[0]  # (T, V)
    return float(logprobs.gather(1, torch.tensor(ids[1:])[:, None]).sum().detach())


def test_beam_scores_are_the_sequence_log_probabilities(decoder: LSTMDecoder) -> None:
    feats = torch.randn(4, 7, 10)
    for feat, hyp in zip(feats, beam_search(decoder, feats, SPECIAL, DecodeOptions(beam_size=4, max_length=10))):
        eos = 2 if hyp.finished else None
        assert hyp.logprob == pytest.approx(sequence_logprob(decoder, feat, hyp.tokens, eos), abs=1e-4)
        assert hyp.attn.shape == (len(hyp.tokens), 1, 1, 7)


def test_beam_search_is_batch_independent(decoder: LSTMDecoder) -> None:
    feats = torch.randn(4, 7, 10)
    options = DecodeOptions(beam_size=3, max_length=10)
    together = beam_search(decoder, feats, SPECIAL, options)
    alone = [beam_search(decoder, feats[i : i + 1], SPECIAL, options)[0] for i in range(4)]
    assert [h.tokens for h in together] == [h.tokens for h in alone]


def test_wider_beam_finds_no_worse_caption(decoder: LSTMDecoder) -> None:
    feats = torch.randn(6, 7, 10)
    narrow = beam_search(decoder, feats, SPECIAL, DecodeOptions(beam_size=1, max_length=10))
    wide = beam_search(decoder, feats, SPECIAL, DecodeOptions(beam_size=5, max_length=10))
    for n, w in zip(narrow, wide):
        if n.finished and w.finished:
            assert w.logprob >= n.logprob - 1e-5


def test_no_hypothesis_ends(decoder: LSTMDecoder) -> None:
    """When <eos> can never win, the best unfinished hypothesis comes back, never a crash."""
    with torch.no_grad():
        decoder.out_vocab.bias[2] = -1e4  # <eos> never chosen
    feats = torch.randn(2, 7, 10)
    options = DecodeOptions(beam_size=3, max_length=6)
    for hyps in (beam_search(decoder, feats, SPECIAL, options), greedy_decode(decoder, feats, SPECIAL, options)):
        assert all(not h.finished and len(h.tokens) == 6 for h in hyps)
        assert all(h.attn.shape[0] == 6 for h in hyps)


def test_beam_search_ranks_by_the_length_penalty() -> None:
    """With a beam wide enough to hold every hypothesis (2 words, up to 4 of them), beam search
    must return exactly the caption that maximises log-probability / ((5 + length) / 6) ** alpha,
    found by enumerating all captions. The witness below shows the winner changes with alpha, so
    a search that ignored alpha would fail here."""
    torch.manual_seed(0)
    decoder = LSTMDecoder(LSTMConfig(embed_dim=8, hidden_dim=12, attention_dim=6, dropout=0.0), 5, 6).eval()
    with torch.no_grad():
        decoder.out_vocab.weight.mul_(3.0)  # a peakier model: captions of different lengths compete
    feats = torch.randn(8, 4, 6)  # (B, N, D)
    assert_beam_ranks_by_length_penalty(decoder, feats, bos=1, eos=2)


def test_config_length_penalty_reaches_the_search() -> None:
    """decode.length_penalty from the config ranks the model's beams: each caption's score is its
    log-probability over the penalty of its length (the raw log-probability when it is ignored)."""
    model = tiny_model("decode.length_penalty=1.5")
    captions = model.caption(torch.randn(4, 3, 32, 32), beam_size=3, max_length=6)
    assert any(len(c.tokens) != 1 for c in captions)  # length 1 is the one length the penalty leaves alone
    for c in captions:
        assert c.score == pytest.approx(c.logprob / ((5 + len(c.tokens)) / 6) ** 1.5, rel=1e-5)


def test_captioner_captions_a_batch_with_maps() -> None:
    model = tiny_model()
    images = torch.randn(3, 3, 32, 32)
    captions = model.caption(images, beam_size=3, max_length=7)
    assert len(captions) == 3
    for caption in captions:
        assert caption.attn.shape == (len(caption.words), 1, 1, 2, 2)  # 32 px / 16 = a 2x2 grid
        assert caption.heatmaps().shape == (len(caption.words), 2, 2)
        assert caption.text == " ".join(caption.words)


def test_skipping_padding_changes_nothing(decoder: LSTMDecoder) -> None:
    """Rows sorted longest first: the logits inside each caption equal the full computation."""
    feats = torch.randn(4, 7, 10)
    tokens = torch.randint(1, 20, (4, 6))
    lengths = torch.tensor([6, 4, 4, 1])
    full = decoder(feats, tokens)
    short = decoder(feats, tokens, lengths)
    for row, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(short.logits[row, :n], full.logits[row, :n])
        torch.testing.assert_close(short.attn[row, :n], full.attn[row, :n])
        assert (short.logits[row, n:] == 0).all()
    with pytest.raises(ValueError, match="sorted"):
        decoder(feats, tokens, torch.tensor([1, 6, 4, 4]))


def test_banned_tokens_keep_words_and_maps_aligned() -> None:
    """<pad>, <bos> and <unk> are never produced, so every word of a caption is a word with its own map."""
    model = tiny_model()
    with torch.no_grad():
        model.decoder.out_vocab.bias[model.vocab.pad_id] = 50.0  # an untrained model that loves <pad>
    for beam in (1, 3):
        for caption in model.caption(torch.randn(2, 3, 32, 32), beam_size=beam, max_length=6):
            assert not {model.vocab.pad_id, model.vocab.bos_id, model.vocab.unk_id} & set(caption.tokens)
            assert len(caption.words) == len(caption.tokens) == caption.attn.shape[0]


def test_sampling(decoder: LSTMDecoder) -> None:
    feats = torch.randn(4, 7, 10)
    greedy = greedy_decode(decoder, feats, SPECIAL, DecodeOptions(max_length=8))
    cold = sample_n_best(decoder, feats, SPECIAL, DecodeOptions(max_length=8, sample=True, temperature=1e-4, seed=0))
    assert [hyps[0].tokens for hyps in cold] == [h.tokens for h in greedy]  # near-zero temperature is greedy
    draws = [
        [hyps[0].tokens for hyps in sample_n_best(decoder, feats, SPECIAL,
                                                  DecodeOptions(max_length=8, sample=True, temperature=1.5, seed=s))]
        for s in (0, 0, 1)
    ]
    assert draws[0] == draws[1] and draws[0] != draws[2]  # reproducible for a seed, varied across seeds


def test_attention_computes_the_papers_tanh_scores(decoder: LSTMDecoder) -> None:
    """The sigmoid form (doubled projection, 2 sigmoid(2x) - 1) gives e = w^T tanh(W_h h + W_s s) + b."""
    attention = decoder.attention
    feats, state = torch.randn(4, 7, 10), torch.randn(4, 12)
    hidden = torch.tanh(attention.feat_proj(feats) + attention.state_proj(state).unsqueeze(1))  # (B, N, A)
    weights = attention.score(hidden).squeeze(-1).softmax(dim=-1)  # (B, N)
    context, got = attention(feats, attention.project(feats), state)
    torch.testing.assert_close(got, weights, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(context, torch.bmm(weights.unsqueeze(1), feats).squeeze(1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("grad", "block_bytes"),
                         [(False, 1), (False, 1400), (False, 1 << 22), (False, None), (True, 1 << 22)])
def test_step_reads_one_memory_for_every_beam_of_an_image(decoder: LSTMDecoder, grad: bool, block_bytes: int | None,
                                                          monkeypatch) -> None:
    """B images' memory with B*K state rows (rows b*K.. of image b) steps as the memory
    repeated K times would: the in-place blocks without gradients (one image per block, two
    images and a short last block, all at once; None: the GPU's and a compiled graph's one block
    of every row), expanded rows with them."""
    if block_bytes is None:
        monkeypatch.setattr(attention_module, "in_one_block", lambda feats: True)
    else:  # one image's block here: 4 x 7 x 6 floats, 672 bytes
        monkeypatch.setattr(attention_module, "BLOCK_BYTES", block_bytes)
    feats, K = torch.randn(3, 7, 10), 4
    memory = decoder.prepare(feats)
    rows = torch.arange(3).repeat_interleave(K)  # (B*K,)
    state = {k: v.index_select(0, rows) + 0.1 * torch.randn_like(v.index_select(0, rows)) for k,
             v in decoder.init_state(memory).items()}
    prev = torch.randint(0, 20, (3 * K,))
    with torch.set_grad_enabled(grad):
        shared = decoder.step(decoder.expand_memory(memory, K), prev, state)
    expanded = decoder.step({k: v.index_select(0, rows) for k, v in memory.items()}, prev, state)
    for a, b in zip(shared[:2], expanded[:2]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert decoder.expand_memory(memory, K) is memory


def test_beam_search_without_expanded_memory_finds_the_same_captions(decoder: LSTMDecoder, monkeypatch) -> None:
    feats = torch.randn(5, 7, 10)
    options = DecodeOptions(beam_size=3, max_length=9, n_best=3)
    from captioner.models.decoder import Decoder
    from captioner.models.decoding import beam_search_n_best

    shared = beam_search_n_best(decoder, feats, SPECIAL, options)
    monkeypatch.setattr(LSTMDecoder, "expand_memory", Decoder.expand_memory)  # every beam its own copy
    repeated = beam_search_n_best(decoder, feats, SPECIAL, options)
    assert [[h.tokens for h in hyps] for hyps in shared] == [[h.tokens for h in hyps] for hyps in repeated]
    for a, b in zip(shared, repeated):
        for x, y in zip(a, b):
            assert x.score == pytest.approx(y.score, abs=1e-5)
            torch.testing.assert_close(x.attn, y.attn, atol=1e-6, rtol=1e-5)
