"""Inference: greedy decoding, sampling and batched (diverse) beam search, through the decoder
interface alone: decoder, feats (B, N, D), `SpecialTokens`, `DecodeOptions` -> per image hypotheses."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from captioner.core.decode_results import Hypothesis
from captioner.core.decode_schema import check_search
from captioner.models.decoding.beam import Beam
from captioner.models.decoding.rules import DecodeOptions, SpecialTokens
from captioner.models.decoding.sampling import argmax, drawing, roll_out
from captioner.models.products import reused_weights

if TYPE_CHECKING:
    from captioner.models.decoder import Decoder


def decode_hypotheses(
    decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions
) -> list[list[Hypothesis]]:
    """feats (B, N, D) -> per image its `n_best` hypotheses, best first, drawn, searched or greedy."""
    if options.sample:
        return sample_n_best(decoder, feats, special, options)
    if options.beam_size <= 1:
        return [[h] for h in greedy_decode(decoder, feats, special, options)]
    return beam_search_n_best(decoder, feats, special, options)


@torch.no_grad()
def greedy_decode(
    decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions
) -> list[Hypothesis]:
    """The most probable word at each step; score: the log-probability of the words and the <eos>."""
    return hypotheses(decoder, feats, special, options, argmax)


@torch.no_grad()
def sample_n_best(
    decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions
) -> list[list[Hypothesis]]:
    """`n_best` captions drawn per image, most probable first (at temperature 1, <eos> counted)."""
    B, n = feats.shape[0], options.n_best
    rows = feats.repeat_interleave(n, dim=0)  # (B*n, N, D): n draws per image
    drawn = hypotheses(decoder, rows, special, options, drawing(options, feats.device))
    return [sorted(drawn[b * n : (b + 1) * n], key=lambda h: -h.score) for b in range(B)]


def hypotheses(
    decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions,
    pick: Callable[[torch.Tensor], torch.Tensor],
) -> list[Hypothesis]:
    """One caption per row of feats (R, N, D) from `roll_out` with its maps, copied once after the loop."""
    out = roll_out(decoder, decoder.prepare(feats), special, options, pick, maps=True)
    assert out.attn is not None  # made with maps
    ended = (out.tokens == special.eos).any(dim=1)  # (R,): a row's words are never <eos> before its end
    steps = out.logprobs[:, : out.attn.shape[1]].unbind(1)  # (R,) each
    score = sum(steps, torch.zeros_like(steps[0]))  # (R,): added step by step, as the words came
    tokens_rt, attn_rt = out.tokens.cpu(), out.attn.float().cpu()  # (R, T), (R, steps, L, H, N)
    self_rt = None if out.self_attn is None else out.self_attn.cpu()  # (R, steps, L, H, steps)
    ends, scores, finished = (out.lengths - ended.long()).tolist(), score.tolist(), ended.tolist()
    return [
        Hypothesis(tokens_rt[r, :n].tolist(), scores[r], scores[r], attn_rt[r, :n], finished[r],
                   None if self_rt is None else self_rt[r, :n, ..., :n])  # self_attn (n, L, H, n)
        for r, n in enumerate(ends)
    ]


@torch.no_grad()
def beam_search(
    decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions
) -> list[Hypothesis]:
    """The best hypothesis per image of `beam_search_n_best`; feats (B, N, D)."""
    ranked = beam_search_n_best(decoder, feats, special, dataclasses.replace(options, n_best=1))
    return [hyps[0] for hyps in ranked]


@torch.no_grad()
@reused_weights()  # the dense layers' weights reordered once for the whole search
def beam_search_n_best(
    decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions
) -> list[list[Hypothesis]]:
    """Batched beam search, K beams in G diverse groups per image -> per image the `n_best` (<= K) best
    distinct hypotheses; at `max_length` live beams compete with the finished ones (finished=False)."""
    check_search({"beam_size": options.beam_size, "diverse_groups": options.diverse_groups, "n_best": options.n_best})
    if decoder.vocab_size >= 2**24:  # the step's read carries word ids in float32
        raise ValueError(f"beam search handles vocabularies under 2**24 words; this one has {decoder.vocab_size}")
    beam = Beam(decoder, feats, special, options)
    for t in range(options.max_length):
        candidates = beam.expand(t)  # (B, G, K/G*V)
        choice = beam.select(candidates)
        beam.advance(choice)
        beam.finish(choice, t)
        if all(beam.done):
            break
        beam.follow_parents()
    return beam.best(options.n_best)
