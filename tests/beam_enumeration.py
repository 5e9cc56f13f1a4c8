"""The length-penalty check of helpers.assert_beam_ranks_by_length_penalty, with the enumeration
scored in one teacher-forced batch: every hypothesis of every image at once, instead of one
forward call per hypothesis, image and alpha (1512 calls for 8 images). The decoder must be
causal (position t sees only inputs up to t), so the padding after a short hypothesis changes
none of its log-probabilities."""

from __future__ import annotations

import itertools

import pytest
import torch


def hypotheses(words: list[int], max_length: int) -> list[tuple[list[int], bool]]:
    """Each sequence of `words` ended by <eos> within `max_length` steps, then each of
    `max_length` words cut off there (it competes with the same score): (tokens, finished)."""
    ended = [(list(s), True) for n in range(max_length) for s in itertools.product(words, repeat=n)]
    cut_off = [(list(s), False) for s in itertools.product(words, repeat=max_length)]
    return ended + cut_off


def enumerated_logprobs(decoder, feats: torch.Tensor, candidates: list[tuple[list[int], bool]], bos: int,
                        eos: int) -> torch.Tensor:
    """Teacher-forced log-probability of each candidate for each image of `feats` (B, N, D):
    (B, C), independent of the search's cached steps."""
    ids = [[bos, *tokens] + ([eos] if finished else []) for tokens, finished in candidates]
    T = max(len(i) for i in ids) - 1
    inputs = torch.tensor([i[:-1] + [eos] * (T + 1 - len(i)) for i in ids])  # (C, T), padded after the end
    targets = torch.tensor([i[1:] + [0] * (T + 1 - len(i)) for i in ids])  # (C, T)
    valid = torch.tensor([[t < len(i) - 1 for t in range(T)] for i in ids])  # (C, T)
    B, C = feats.shape[0], len(candidates)
    with torch.no_grad():
        logits = decoder(feats.repeat_interleave(C, dim=0), inputs.repeat(B, 1)).logits  # (B*C, T, V)
        logprobs = logits.float().log_softmax(-1).gather(2, targets.repeat(B, 1)[..., None])[..., 0]  # (B*C, T)
    return (logprobs * valid.repeat(B, 1)).sum(-1).view(B, C)


def assert_beam_ranks_by_length_penalty(decoder, feats: torch.Tensor, bos: int, eos: int) -> None:
    """Beam search with a beam holding every hypothesis (words 3 and 4, up to 4 of them) returns,
    for each of `feats` (B, N, D), the enumeration's best caption by log-probability divided by
    GNMT's ((5 + length) / 6) ** alpha, with its score, for alpha 0, 0.7 and 2; and the winner
    changes with alpha (longer for 2), so a search that ignored alpha would fail."""
    from captioner.models.decoding import DecodeOptions, SpecialTokens, beam_search

    candidates = hypotheses([3, 4], max_length=5)
    logprobs = enumerated_logprobs(decoder, feats, candidates, bos, eos).tolist()  # B lists of C floats
    winners = {}
    for alpha in (0.0, 0.7, 2.0):
        options = DecodeOptions(beam_size=32, max_length=5, length_penalty=alpha)
        hyps = beam_search(decoder, feats, SpecialTokens(bos, eos, (0, bos)), options)
        expected = []
        for image in logprobs:
            best: tuple[list[int], float] = ([], float("-inf"))
            for (tokens, _), logprob in zip(candidates, image):
                score = logprob / ((5.0 + len(tokens)) / 6.0) ** alpha
                if score > best[1]:  # the first of equal scores, as the enumeration's order gives them
                    best = (tokens, score)
            expected.append(best)
        assert [h.tokens for h in hyps] == [tokens for tokens, _ in expected], alpha
        assert [h.score for h in hyps] == pytest.approx([score for _, score in expected], abs=1e-4)
        winners[alpha] = [h.tokens for h in hyps]
    flips = sum(a != b for a, b in zip(winners[0.0], winners[2.0]))
    assert flips >= 2 and all(len(b) >= len(a) for a, b in zip(winners[0.0], winners[2.0]))
