"""Decoding options: sampling with gradients (SCST), trigram blocking, diverse beam search,
n-best output, top-k / nucleus sampling, and live-vs-finished beams at max_length."""

from __future__ import annotations

import pytest
import torch

from captioner.decoding import sample_captions
from captioner.models.decoder import Decoder
from helpers import tiny_model

BOS, EOS = 1, 2
BANNED = (0, 1, 3)  # <pad>, <bos>, <unk>


@pytest.fixture(params=["lstm", "transformer"])
def decoder(request: pytest.FixtureRequest) -> Decoder:
    return tiny_model(f"model.decoder.type={request.param}").decoder


def teacher_forced_logprob(decoder: Decoder, feats: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(R,) log-probability of each padded row of tokens (R, T) under teacher forcing, masked positions only."""
    inputs = torch.cat([torch.full_like(tokens[:, :1], BOS), tokens[:, :-1]], dim=1)  # (R, T): <bos> + prefix
    logprobs = decoder(feats, inputs).logits.log_softmax(-1)  # (R, T, V)
    return (logprobs.gather(2, tokens[:, :, None]).squeeze(2) * mask).sum(dim=1)  # (R,)


def test_sampled_logprobs_equal_teacher_forcing_and_masks_are_consistent(decoder: Decoder) -> None:
    torch.manual_seed(1)
    feats = torch.randn(3, 16, decoder_feat_dim(decoder))
    out = sample_captions(decoder, feats, BOS, EOS, n=4, max_length=12, banned=BANNED, generator=torch.Generator().manual_seed(0))
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


def decoder_feat_dim(decoder: Decoder) -> int:
    if hasattr(decoder, "grid_proj"):
        return decoder.grid_proj[0].in_features
    return decoder.init_h.in_features


def test_sampling_has_gradients_in_train_mode(decoder: Decoder) -> None:
    decoder.train()  # dropout on, as in SCST
    feats = torch.randn(2, 16, decoder_feat_dim(decoder))
    out = sample_captions(decoder, feats, BOS, EOS, n=3, max_length=8, banned=BANNED)
    assert out.logprobs.requires_grad
    decoder.zero_grad()
    (-out.caption_logprobs().sum()).backward()
    grads = [p.grad.abs().sum() for p in decoder.parameters() if p.grad is not None]
    assert grads and float(sum(grads)) > 0


def test_sampling_under_autocast(decoder: Decoder) -> None:
    feats = torch.randn(2, 16, decoder_feat_dim(decoder))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sample_captions(decoder, feats, BOS, EOS, n=2, max_length=6, banned=BANNED)
    assert out.logprobs.dtype == torch.float32 and torch.isfinite(out.logprobs).all()
    out.caption_logprobs().sum().backward()


def test_seeded_sampling_reproduces(decoder: Decoder) -> None:
    feats = torch.randn(2, 16, decoder_feat_dim(decoder))
    runs = [
        sample_captions(decoder, feats, BOS, EOS, n=5, max_length=10, banned=BANNED, generator=torch.Generator().manual_seed(7))
        for _ in range(2)
    ]
    assert torch.equal(runs[0].tokens, runs[1].tokens)
    other = sample_captions(decoder, feats, BOS, EOS, n=5, max_length=10, banned=BANNED, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(runs[0].tokens, other.tokens)
