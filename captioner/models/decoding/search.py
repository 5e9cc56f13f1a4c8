"""Inference: greedy decoding, sampling and batched (diverse) beam search over whole batches of
images, through the decoder interface alone.

Each function takes the decoder, the features (B, N, D), the `SpecialTokens` and one
`DecodeOptions`, and returns, per image, hypotheses with their word ids, scores and the attention
map of every word. Greedy decoding and sampling run `sampling.roll_out` (the loop SCST's
roll-outs run too) with its maps; the beam search's state and steps are `beam.Beam`; the rules
every mode applies to a step are in `rules.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from captioner.core.decode_schema import check_search
from captioner.models.decoding.beam import Beam
from captioner.models.decoding.options import DecodeOptions
from captioner.models.decoding.rules import SpecialTokens
from captioner.models.decoding.sampling import argmax, drawing, roll_out
from captioner.models.decoding.stepping import Hypothesis
from captioner.models.products import reused_weights

if TYPE_CHECKING:
    from captioner.models.decoder import Decoder


def decode_hypotheses(
    decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions
) -> list[list[Hypothesis]]:
    """feats (B, N, D) -> per image its `n_best` hypotheses, best first: drawn with `sample`,
    else by beam search, or greedy decoding when the beam is 1."""
    if options.sample:
        return sample_n_best(decoder, feats, special, options)
    if options.beam_size <= 1:
        return [[h] for h in greedy_decode(decoder, feats, special, options)]
    return beam_search_n_best(decoder, feats, special, options)


@torch.no_grad()
def greedy_decode(
    decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions
) -> list[Hypothesis]:
    """The most probable word at each step; feats (B, N, D). Uses max_length, min_length,
    suppress_bad_endings, block_trigrams and self_attention of the options. The score is the
    log-probability of the words and the <eos>."""
    return hypotheses(decoder, feats, special, options, argmax)


@torch.no_grad()
def sample_n_best(
    decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions
) -> list[list[Hypothesis]]:
    """`n_best` captions drawn per image, most probable first; feats (B, N, D).

    Each word is drawn from softmax(logprobs / temperature), restricted to the `top_k` words and
    the `top_p` nucleus, from a generator seeded by `seed` (on the features' device); the score is
    the model's log-probability (at temperature 1) of the words and the <eos>."""
    B, n = feats.shape[0], options.n_best
    rows = feats.repeat_interleave(n, dim=0)  # (B*n, N, D): n draws per image
    drawn = hypotheses(decoder, rows, special, options, drawing(options, feats.device))
    return [sorted(drawn[b * n : (b + 1) * n], key=lambda h: -h.score) for b in range(B)]


def hypotheses(
    decoder: Decoder,
    feats: torch.Tensor,
    special: SpecialTokens,
    options: DecodeOptions,
    pick: Callable[[torch.Tensor], torch.Tensor],
) -> list[Hypothesis]:
    """One caption per row of feats (R, N, D) from `roll_out` with its maps (and, with
    `self_attention`, the self-attention weights of this same pass, for decoders that have one).
    One copy of each thing the host keeps, after the loop; none per image."""
    out = roll_out(decoder, decoder.prepare(feats), special, options, pick, maps=True)
    assert out.attn is not None  # made with maps
    ended = (out.tokens == special.eos).any(dim=1)  # (R,): a row's words are never <eos> before its end
    steps = out.logprobs[:, : out.attn.shape[1]].unbind(1)  # (R,) each
    score = sum(steps, torch.zeros_like(steps[0]))  # (R,): added step by step, as the words came
    tokens_rt, attn_rt = out.tokens.cpu(), out.attn.float().cpu()  # (R, T), (R, steps, L, H, N)
    self_rt = None if out.self_attn is None else out.self_attn.cpu()  # (R, steps, L, H, steps)
    ends, scores, finished = (out.lengths - ended.long()).tolist(), score.tolist(), ended.tolist()
    hyps = [Hypothesis(tokens_rt[r, :n].tolist(), scores[r], scores[r], attn_rt[r, :n], finished[r])
            for r, n in enumerate(ends)]
    for hyp, n, self_maps in zip(hyps, ends, [] if self_rt is None else self_rt):
        hyp.self_attn = self_maps[:n, ..., :n]  # (n, L, H, n)
    return hyps


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
    """Batched (diverse) beam search over B images with K beams each; feats (B, N, D).

    Returns per image the `n_best` (<= K) best distinct hypotheses, best first.

    The K = `beam_size` beams of an image form G = `diverse_groups` groups of K/G beams
    (Vijayakumar et al. 2018; one group is ordinary beam search). Every step runs the decoder once
    over all B*K beams; then each group keeps its top 2K/G continuations (`Beam.select`, with the
    Hamming diversity penalty between groups): those ending in <eos> that rank within the top K/G
    become finished hypotheses, the best K/G others stay live. A group is done once it has K/G
    finished hypotheses that no live beam of it can still beat. At `max_length` the live beams of
    groups not done compete with the finished hypotheses on the same length-penalised score, so a
    cut-off beam that is clearly better than every ended one wins (finished=False). With
    `self_attention`, the self-attention weights of every step come back with each hypothesis.
    On the CPU the images whose searches are all done stop being stepped: the batch's search then
    costs about what its images' searches cost alone, and finds the same hypotheses.
    """
    check_search({"beam_size": options.beam_size, "diverse_groups": options.diverse_groups, "n_best": options.n_best})
    if decoder.vocab_size >= 2**24:  # the step's read carries word ids in float32
        raise ValueError(f"beam search handles vocabularies under 2**24 words; this one has {decoder.vocab_size}")
    beam = Beam(decoder, feats, special, options)
    for t in range(options.max_length):
        candidates = beam.expand(t)  # (B, G, K/G*V)
        choice = beam.select(candidates)
        beam.advance(choice)
        beam.finish(choice, t)
        if beam.all_done:
            break
        beam.follow_parents()
    return beam.best(options.n_best)
