"""The transformer decoder: the cached step path against teacher forcing, masks, and decoding."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_beam_ranks_by_length_penalty, tiny_model

from captioner.core.config_sections import Config
from captioner.data.batching import CaptionBatch
from captioner.models.attention import MultiHeadAttention
from captioner.models.captioner import Captioner
from captioner.models.decoder import select_rows
from captioner.models.decoding import DecodeOptions, SpecialTokens, beam_search, greedy_decode
from captioner.models.decoders.transformer import TransformerConfig, TransformerDecoder, grid_encoding
from captioner.text.vocab import SPECIALS, Vocabulary
from captioner.training.loop import caption_loss

V, D, N = 13, 6, 9  # vocabulary, feature dim, a 3x3 grid
BOS, EOS = 1, 2
SPECIAL = SpecialTokens(BOS, EOS)


def make_decoder(norm_first: bool = False, tie: bool = True, grid_pe: bool = True, seed: int = 0) -> TransformerDecoder:
    torch.manual_seed(seed)
    config = TransformerConfig(d_model=16, num_layers=2, num_heads=4, ff_dim=32, dropout=0.1, norm_first=norm_first,
                               tie_embeddings=tie, grid_position_encoding=grid_pe)
    decoder = TransformerDecoder(config, V, D)
    return decoder.eval().double()  # float64: the two paths agree far below the tolerance


def inputs(B: int = 3, T: int = 7, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(B, N, D, generator=g, dtype=torch.float64)  # (B, N, D)
    tokens = torch.randint(0, V, (B, T), generator=g)  # (B, T)
    tokens[:, 0] = BOS
    return feats, tokens


def run_steps(decoder: TransformerDecoder, feats: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
    memory = decoder.prepare(feats)
    state = decoder.init_state(memory)
    logprobs, maps = [], []
    for t in range(tokens.shape[1]):
        lp, attn, state = decoder.step(memory, tokens[:, t], state)
        logprobs.append(lp)
        maps.append(attn)
    return torch.stack(logprobs, dim=1), torch.stack(maps, dim=1)  # (B, T, V), (B, T, L, nh, N)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@torch.no_grad()
def test_step_with_cache_matches_teacher_forcing(norm_first: bool, tie: bool) -> None:
    decoder = make_decoder(norm_first, tie)
    feats, tokens = inputs()
    out = decoder(feats, tokens)
    step_logprobs, step_attn = run_steps(decoder, feats, tokens)
    assert out.logits.shape == (3, 7, V)
    assert out.attn.shape == step_attn.shape == (3, 7, 2, 4, N)
    torch.testing.assert_close(out.logits.log_softmax(-1), step_logprobs, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.attn, step_attn, atol=1e-5, rtol=0)
    assert decoder.out.weight is decoder.embedding.weight if tie else decoder.out.weight is not decoder.embedding.weight


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
@torch.no_grad()
def test_causal_mask_later_tokens_never_change_earlier_logits(norm_first: bool) -> None:
    decoder = make_decoder(norm_first)
    feats, tokens = inputs(T=8)
    changed = tokens.clone()
    changed[:, 5:] = (tokens[:, 5:] + 1) % V
    a, b = decoder(feats, tokens), decoder(feats, changed)
    torch.testing.assert_close(a.logits[:, :5], b.logits[:, :5], atol=1e-10, rtol=0)
    torch.testing.assert_close(a.attn[:, :5], b.attn[:, :5], atol=1e-10, rtol=0)
    assert not torch.allclose(a.logits[:, 5:], b.logits[:, 5:])  # the change does reach the later positions


@torch.no_grad()
def test_cross_attention_is_permutation_equivariant_without_grid_encoding() -> None:
    decoder = make_decoder(grid_pe=False)
    feats, tokens = inputs()
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(3))
    a, b = decoder(feats, tokens), decoder(feats[:, perm], tokens)
    torch.testing.assert_close(b.logits, a.logits, atol=1e-10, rtol=0)
    torch.testing.assert_close(b.attn, a.attn[..., perm], atol=1e-10, rtol=0)
    # The 2-D encoding is what tells the cells apart: with it, the same permutation changes the words.
    with_pe = make_decoder(grid_pe=True)
    assert not torch.allclose(with_pe(feats[:, perm], tokens).logits, with_pe(feats, tokens).logits)


@torch.no_grad()
def test_attention_rows_sum_to_one_over_the_grid() -> None:
    decoder = make_decoder()
    feats, tokens = inputs()
    out_attn = decoder(feats, tokens).attn  # (B, T, L, nh, N)
    _, step_attn = run_steps(decoder, feats, tokens)
    for attn in (out_attn, step_attn):
        assert (attn >= 0).all()
        torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:-1], dtype=attn.dtype))
    assert out_attn.std(dim=-1).max() > 1e-3  # not uniform: the rows do depend on the scores


def test_attention_weight_dropout_only_in_training() -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, dropout=0.5)
    q, kv = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
    out_a, w_a = mha.eval()(q, kv)
    out_b, w_b = mha(q, kv)
    torch.testing.assert_close(out_a, out_b)  # eval is deterministic
    out_c, w_c = mha.train()(q, kv)
    torch.testing.assert_close(w_c, w_a)  # returned weights are the distribution before dropout
    assert not torch.allclose(out_c, out_a)  # dropout did fall on the weights used for the sum


def test_grid_encoding_codes_rows_and_columns() -> None:
    enc = grid_encoding(9, 8)  # (9, 8): a 3x3 grid, row-major
    rows, cols = enc[:, :4], enc[:, 4:]
    torch.testing.assert_close(rows[0], rows[2])  # cells 0..2 share row 0
    torch.testing.assert_close(cols[0], cols[6])  # cells 0, 3, 6 share column 0
    assert not torch.allclose(rows[0], rows[3]) and not torch.allclose(cols[0], cols[1])
    flat = grid_encoding(6, 8)  # not a perfect square: a distinct 1-D code per cell
    assert torch.cdist(flat, flat).add(torch.eye(6)).min() > 0.1


@torch.no_grad()
def test_beam_width_one_equals_greedy() -> None:
    decoder = make_decoder(norm_first=True)
    feats, _ = inputs(B=4)
    greedy = greedy_decode(decoder, feats, SPECIAL, DecodeOptions(max_length=12))
    beam = beam_search(decoder, feats, SPECIAL, DecodeOptions(beam_size=1, max_length=12, length_penalty=0.0))
    assert [h.tokens for h in beam] == [h.tokens for h in greedy]
    assert [h.logprob for h in beam] == pytest.approx([h.logprob for h in greedy], abs=1e-6)


@torch.no_grad()
def test_beam_search_ranks_by_the_length_penalty() -> None:
    """As for the LSTM: a beam holding every hypothesis (2 words, up to 4 of them) returns the
    caption that maximises log-probability / ((5 + length) / 6) ** alpha over all captions, and
    the winner changes with alpha (so a search that ignored alpha fails)."""
    torch.manual_seed(0)
    config = TransformerConfig(d_model=16, num_layers=2, num_heads=4, ff_dim=32, dropout=0.0, tie_embeddings=False)
    decoder = TransformerDecoder(config, 5, D)
    decoder = decoder.eval().double()
    decoder.out.weight.mul_(3.0)  # a peakier model: captions of different lengths compete
    feats = torch.randn(8, N, D, dtype=torch.float64)  # (B, N, D)
    assert_beam_ranks_by_length_penalty(decoder, feats, BOS, EOS)


def test_config_length_penalty_reaches_the_search() -> None:
    """decode.length_penalty from the config ranks the transformer's beams too."""
    model = tiny_model("model.decoder.type=transformer", "decode.length_penalty=1.5")
    captions = model.caption(torch.randn(4, 3, 32, 32), beam_size=3, max_length=6)
    assert any(len(c.tokens) != 1 for c in captions)  # length 1 is the one length the penalty leaves alone
    for c in captions:
        assert c.score == pytest.approx(c.logprob / ((5 + len(c.tokens)) / 6) ** 1.5, rel=1e-5)


@torch.no_grad()
def test_step_commutes_with_reordering_the_state() -> None:
    """What beam search relies on: picking rows of memory and state, then stepping, equals
    stepping, then picking the same rows of the outputs."""
    decoder = make_decoder(norm_first=True)
    feats, tokens = inputs(B=4)
    memory = decoder.prepare(feats)
    state = decoder.init_state(memory)
    for t in range(3):
        _, _, state = decoder.step(memory, tokens[:, t], state)
    rows = torch.tensor([2, 0, 0, 3, 1])
    lp_a, attn_a, state_a = decoder.step(select_rows(memory, rows), tokens[rows, 3], select_rows(state, rows))
    lp_b, attn_b, state_b = decoder.step(memory, tokens[:, 3], state)
    torch.testing.assert_close(lp_a, lp_b[rows])
    torch.testing.assert_close(attn_a, attn_b[rows])
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        torch.testing.assert_close(state_a[key], state_b[key][rows])


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_norm", "pre_norm"])
@torch.no_grad()
def test_beam_search_reorders_the_cache(norm_first: bool) -> None:
    """A hypothesis's log-probability is its own teacher-forced one only if every reordering of
    the beams moved each layer's key/value cache and the position along with it."""
    decoder = make_decoder(norm_first, tie=False, seed=4)
    decoder.out.weight.mul_(3.0)  # a peakier, less repetitive random model: beams diverge
    decoder.out.bias[EOS] += 1.0  # some hypotheses end within max_length, others do not
    feats, _ = inputs(B=8, seed=5)
    hyps = beam_search(decoder, feats, SPECIAL, DecodeOptions(beam_size=3, max_length=8, length_penalty=0.0))
    greedy = greedy_decode(decoder, feats, SPECIAL, DecodeOptions(max_length=8))
    # Witnesses that the search left the top beam (the row a stale cache would still get right).
    assert any(h.tokens != g.tokens for h, g in zip(hyps, greedy))
    assert any(h.finished for h in hyps)
    for b, hyp in enumerate(hyps):
        targets = torch.tensor(hyp.tokens + ([EOS] if hyp.finished else []))  # (T,)
        prefix = torch.tensor([BOS] + hyp.tokens)[: len(targets)]  # (T,)
        out = decoder(feats[b : b + 1], prefix[None])
        logprob = out.logits[0].log_softmax(-1).gather(1, targets[:, None]).sum()
        assert hyp.logprob == pytest.approx(float(logprob), rel=1e-5, abs=1e-5)  # beam scores add in float32
        torch.testing.assert_close(hyp.attn, out.attn[0, : len(hyp.tokens)].float(), atol=1e-5, rtol=0)


def tiny_transformer_config() -> Config:
    config = Config()
    config.data.image_size = 32
    config.model.encoder.width = 4  # small_cnn: a 2x2 grid of 32-d features
    config.model.decoder = TransformerConfig(d_model=16, num_layers=2, num_heads=4, ff_dim=32, dropout=0.1)
    config.train.attention_penalty = 0.0
    return config


def test_build_model_captions_images_end_to_end() -> None:
    config = tiny_transformer_config()
    vocab = Vocabulary([*SPECIALS, "a", "red", "blue", "circle", "square"])
    torch.manual_seed(0)
    model = Captioner.from_config(config, vocab, load_pretrained=False)
    assert isinstance(model.decoder, TransformerDecoder)
    images = torch.randn(2, 3, 32, 32)
    for beam_size in (1, 3):
        captions = model.caption(images, beam_size=beam_size, max_length=5)
        assert len(captions) == 2
        for caption in captions:
            assert caption.attn.shape == (len(caption.tokens), 2, 4, 2, 2)  # (T, L, nh, h, w)
            assert caption.heatmaps().shape == (len(caption.tokens), 2, 2)
            assert caption.words == vocab.decode_words(caption.tokens)
    assert model.training  # caption restores the mode


def test_training_loss_reaches_every_decoder_weight() -> None:
    """The training path (`caption_loss`, padded captions of different lengths) runs the
    transformer, and the loss's gradient reaches every decoder parameter."""
    config = tiny_transformer_config()
    vocab = Vocabulary([*SPECIALS, "a", "red", "blue", "circle", "square"])
    torch.manual_seed(0)
    model = Captioner.from_config(config, vocab, load_pretrained=False).train()
    tokens = torch.tensor([[1, 4, 5, 7, 2, 0], [1, 6, 8, 2, 0, 0], [1, 4, 6, 5, 8, 2]])  # (C, T) padded
    lengths = (tokens != vocab.pad_id).sum(dim=1)  # (C,) 5, 4, 6
    batch = CaptionBatch(torch.randn(2, 3, 32, 32), tokens, lengths, torch.tensor([0, 1, 1]), torch.arange(2))
    loss, logs = caption_loss(model, batch, config, encoded=False)
    loss.backward()
    assert torch.isfinite(loss) and logs["penalty"] == 0.0
    for name, param in model.decoder.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
