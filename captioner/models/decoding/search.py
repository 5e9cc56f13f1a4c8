"""Inference: greedy decoding, sampling and batched (diverse) beam search over whole batches of
images, through the decoder interface alone.

Each function takes the decoder, the features (B, N, D), the `SpecialTokens` and one
`DecodeOptions`, and returns, per image, hypotheses with their word ids, scores and the attention
map of every word. The beam search's state and steps are `beam.Beam`; the rules every mode
applies to a step are in `rules.py`; SCST's sampling with gradients is `sampling.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from captioner.core.decode_schema import check_search
from captioner.models.decoding.beam import Beam
from captioner.models.decoding.options import DecodeOptions
from captioner.models.decoding.rules import EndingRule, SpecialTokens, apply_ending_rule, banned_mask, block_repeated_trigrams
from captioner.models.decoding.sampling import check_sampling, draw
from captioner.models.decoding.stepping import Hypothesis, pad_last, step_decoder
from captioner.models.products import reused_weights

if TYPE_CHECKING:
    from captioner.models.decoder import Decoder


def decode_hypotheses(decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions) -> list[list[Hypothesis]]:
    """feats (B, N, D) -> per image its `n_best` hypotheses, best first: drawn with `sample`,
    else by beam search, or greedy decoding when the beam is 1."""
    if options.sample:
        return sample_n_best(decoder, feats, special, options)
    if options.beam_size <= 1:
        return [[h] for h in greedy_decode(decoder, feats, special, options)]
    return beam_search_n_best(decoder, feats, special, options)


@torch.no_grad()
def greedy_decode(decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions) -> list[Hypothesis]:
    """The most probable word at each step; feats (B, N, D). Uses max_length, min_length,
    suppress_bad_endings, block_trigrams and self_attention of the options. The score is the
    log-probability of the words and the <eos>."""
    return decode_step_by_step(decoder, feats, special, options, lambda allowed: allowed.argmax(dim=-1))


@torch.no_grad()
def sample_n_best(decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions) -> list[list[Hypothesis]]:
    """`n_best` captions drawn per image, most probable first; feats (B, N, D).

    Each word is drawn from softmax(logprobs / temperature), restricted to the `top_k` words and
    the `top_p` nucleus, from a generator seeded by `seed` (on the features' device); the score is
    the model's log-probability (at temperature 1) of the words and the <eos>."""
    check_sampling(options.temperature, options.top_k, options.top_p)
    B, n = feats.shape[0], options.n_best
    generator = None if options.seed is None else torch.Generator(feats.device).manual_seed(options.seed)
    rows = feats.repeat_interleave(n, dim=0)  # (B*n, N, D): n draws per image
    drawn = decode_step_by_step(
        decoder, rows, special, options, lambda allowed: draw(allowed, options.temperature, options.top_k, options.top_p, generator)
    )
    return [sorted(drawn[b * n : (b + 1) * n], key=lambda h: -h.score) for b in range(B)]


@reused_weights()  # the dense layers' weights reordered once for the whole loop
def decode_step_by_step(
    decoder: Decoder,
    feats: torch.Tensor,
    special: SpecialTokens,
    options: DecodeOptions,
    pick: Callable[[torch.Tensor], torch.Tensor],
) -> list[Hypothesis]:
    """One caption per row of feats (B, N, D), each word chosen by `pick(allowed logprobs (B, V))
    -> (B,)` (argmax for greedy decoding, a draw for sampling), stopping once every row has ended.
    With `self_attention`, each hypothesis also carries the self-attention weights of this same
    pass (decoders that have one)."""
    batch, max_length = feats.shape[0], options.max_length
    memory = decoder.prepare(feats)
    state = decoder.init_state(memory, capacity=max_length)
    prev = torch.full((batch,), special.bos, dtype=torch.long, device=feats.device)  # (B,)
    maps, self_maps, logprob = [], [], torch.zeros(batch, device=feats.device)
    history = torch.empty((batch, 0), dtype=torch.long, device=feats.device)  # (B, t)
    done = torch.zeros(batch, dtype=torch.bool, device=feats.device)  # (B,)
    lengths = torch.full((batch,), max_length, dtype=torch.long, device=feats.device)  # (B,)
    forbidden = banned_mask(special.banned, decoder.vocab_size, feats.device)  # (V,)
    ending = EndingRule.build(special, options.min_length, options.suppress_bad_endings, decoder.vocab_size, feats.device)
    for t in range(max_length):
        logprobs, attn, state, self_w = step_decoder(decoder, memory, prev, state, options.self_attention)  # (B, V), (B, L, H, N)
        if self_w is not None:
            self_maps.append(self_w.float())  # (B, L, H, t+1)
        logprobs = apply_ending_rule(ending, logprobs.float().masked_fill(forbidden, float("-inf")), prev, t)  # (B, V)
        allowed = block_repeated_trigrams(logprobs, history) if options.block_trigrams else logprobs  # (B, V)
        prev = pick(allowed)  # (B,)
        logprob += torch.where(done, 0.0, logprobs.gather(1, prev[:, None]).squeeze(1))
        history = torch.cat([history, prev[:, None]], dim=1)  # (B, t+1)
        maps.append(attn)
        ended = (prev == special.eos) & ~done
        lengths = lengths.masked_fill(ended, t)  # (B,)
        done |= ended
        if bool(done.all()):  # the step's one read of the device: the early exit
            break
    # One copy of each thing the host keeps, after the loop; none per image.
    tokens_bt = history.cpu()  # (B, T)
    attn_bt = torch.stack(maps, dim=1).float().cpu()  # (B, T, L, H, N)
    T = attn_bt.shape[1]
    self_bt = torch.stack([pad_last(w, T) for w in self_maps], dim=1).cpu() if self_maps else None  # (B, T, L, H, T)
    ends, logprobs_b, done_b = lengths.tolist(), logprob.tolist(), done.tolist()
    results = []
    for b in range(batch):
        n = ends[b]
        self_b = None if self_bt is None else self_bt[b, :n, ..., :n]  # (n, L, H, n)
        results.append(Hypothesis(tokens_bt[b, :n].tolist(), logprobs_b[b], logprobs_b[b], attn_bt[b, :n], done_b[b], self_b))
    return results


@torch.no_grad()
def beam_search(decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions) -> list[Hypothesis]:
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
