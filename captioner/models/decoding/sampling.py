"""Word-by-word decoding: greedy decoding, sampling and SCST's roll-outs as one loop, `roll_out`, and
inference's greedy and sampled hypotheses through the decoder interface alone (`greedy_decode`, `sample_n_best`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from captioner.core.decode_results import Hypothesis
from captioner.core.decode_schema import check_options
from captioner.models.decoder import Decoder, reads_are_free, real_positions, select_rows
from captioner.models.decoding.rules import (
    SHRINK_SHARE, DecodeOptions, EndingRule, SpecialTokens, banned_mask, block_repeated_trigrams, pad_last,
    step_decoder,
)
from captioner.models.products import reused_weights


def restrict_to_top(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits (R, V) with all but the `top_k` words (0: all) and the `top_p` nucleus (Holtzman 2020) at -inf."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (R, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (R, V) each
        probs = sorted_logits.softmax(dim=-1)  # (R, V)
        before = probs.cumsum(dim=-1) - probs  # (R, V): mass of the more probable words
        drop_sorted = before >= top_p  # the most probable word always stays
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)  # (R, V) in vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def draw(
    logprobs: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One word per row from softmax(logprobs / temperature), restricted to top-k / top-p; (R, V) -> (R,)."""
    logits = restrict_to_top(logprobs.detach().float() / temperature, top_k, top_p)  # (R, V)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(1)  # (R,)


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """The sampling options of a direct call, judged by the schema: the same one-line ConfigError."""
    check_options({"temperature": temperature, "top_k": top_k, "top_p": top_p})


@dataclass
class SampledCaptions:
    """`roll_out`'s captions, padded: n per image (sampled, or one greedy), image b's rows consecutive."""

    tokens: torch.Tensor  # (B*n, T) long: word ids, then <eos> where the caption ended, then 0
    logprobs: torch.Tensor  # (B*n, T) float, with grad: the model's log-probability of each token
    mask: torch.Tensor  # (B*n, T) bool: true at the words and the <eos>, false after
    lengths: torch.Tensor  # (B*n,) long: true positions per row (words, plus 1 when it ended)
    image_rows: torch.Tensor  # (B*n,) long: the image each caption describes
    attn: torch.Tensor | None = None  # (B*n, steps, L, H, N): with `roll_out`'s maps, each step's attention
    self_attn: torch.Tensor | None = None  # (B*n, steps, L, H, steps): with maps and self_attention

    def caption_logprobs(self) -> torch.Tensor:
        """(B*n,) each caption's log-probability: its words and its <eos>."""
        return (self.logprobs * self.mask).sum(dim=1)  # (B*n,)


def argmax(allowed: torch.Tensor) -> torch.Tensor:
    """The most probable allowed word of each row: greedy decoding's choice; (R, V) -> (R,)."""
    return allowed.argmax(dim=-1)  # (R,)


def drawing(options: DecodeOptions, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """Sampling's choice of each word, from a generator on `device` seeded by `seed` (None: torch's)."""
    generator = None if options.seed is None else torch.Generator(device).manual_seed(options.seed)
    return lambda allowed: draw(allowed, options.temperature, options.top_k, options.top_p, generator)


@reused_weights()  # the dense layers' weights reordered once for the whole loop
def roll_out(
    decoder: Decoder, memory: dict[str, torch.Tensor], special: SpecialTokens, options: DecodeOptions,
    pick: Callable[[torch.Tensor], torch.Tensor], maps: bool = False,
) -> SampledCaptions:
    """Each of the R rows of `memory` takes one word a step, `pick(allowed logprobs (R, V)) -> (R,)`.
    Ended rows: with `maps`, an early exit read once a step; on the CPU without gradients they leave
    the batch; else (GPU, gradients) they step on <pad>, nothing read back. T = max_length."""
    R, device, T = next(iter(memory.values())).shape[0], next(iter(memory.values())).device, options.max_length
    reads = maps or (reads_are_free(device) and not torch.is_grad_enabled())  # whether a step may read the device
    tokens = torch.zeros((R, T), dtype=torch.long, device=device)  # (R, T)
    chosen = torch.zeros((R, T), device=device)  # (R, T)
    mask = torch.zeros((R, T), dtype=torch.bool, device=device)  # (R, T)
    rows: torch.Tensor | None = None  # (A,): the rows still stepping once some left; None: all R
    done = torch.zeros(R, dtype=torch.bool, device=device)  # (A,)
    prev = torch.full((R,), special.bos, dtype=torch.long, device=device)  # (A,)
    state = decoder.init_state(memory, capacity=T)
    forbidden = banned_mask(special.banned, decoder.vocab_size, device)  # (V,)
    ending = EndingRule.build(special, options.min_length, options.suppress_bad_endings, decoder.vocab_size, device)
    step_maps, step_self = [], []
    for t in range(T):
        logprobs, attn, state, self_w = step_decoder(decoder, memory, prev, state, maps and options.self_attention)
        logprobs = logprobs.float()
        allowed = logprobs.detach().masked_fill(forbidden, float("-inf"))  # (A, V)
        if ending is not None:
            allowed = ending.apply(allowed, prev, t)
        if options.block_trigrams:
            history = tokens if rows is None else tokens.index_select(0, rows)  # (A, T)
            allowed = block_repeated_trigrams(allowed, history[:, :t])  # (A, V)
        prev = pick(allowed).masked_fill(done, 0)  # (A,)
        at = slice(None) if rows is None else rows
        tokens[at, t], mask[at, t] = prev, ~done
        chosen[at, t] = logprobs.gather(1, prev[:, None]).squeeze(1).masked_fill(done, 0.0)
        done = done | (prev == special.eos)
        if maps:
            step_maps.append(attn)  # (R, L, H, N)
        if maps and self_w is not None:
            step_self.append(self_w.float())  # (R, L, H, t+1)
        if not reads:
            continue
        ended = int(done.sum())  # the step's one read of the device
        if ended == len(done):
            break
        if not maps and ended * SHRINK_SHARE >= len(done):
            keep = (~done).nonzero().squeeze(1)  # (A',)
            rows, prev, done = keep if rows is None else rows[keep], prev[keep], done[keep]  # (A',) each
            memory, state = select_rows(memory, keep), select_rows(state, keep)  # (A', ...) each
    out = SampledCaptions(tokens, chosen, mask, mask.sum(dim=1), torch.arange(R, device=device))
    if maps:
        out.attn = torch.stack(step_maps, dim=1)  # (R, steps, L, H, N)
        if step_self:
            out.self_attn = torch.stack([pad_last(w, t + 1) for w in step_self], dim=1)  # (R, steps, L, H, steps)
    return out


def sample_captions(
    decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions
) -> SampledCaptions:
    """SCST's captions; feats (B, N, D). With `sample`, `n_best` drawn per image with gradients, else
    the greedy baseline without; log-probabilities at temperature 1 (Rennie et al. 2017)."""
    n = options.n_best if options.sample else 1
    image_rows = torch.arange(feats.shape[0], device=feats.device).repeat_interleave(n)  # (B*n,)
    memory = decoder.caption_memory(feats, image_rows if n > 1 else None)  # (B*n, ...) each
    with torch.set_grad_enabled(options.sample and torch.is_grad_enabled()):  # a greedy caption: a baseline
        out = roll_out(decoder, memory, special, options, drawing(options, feats.device) if options.sample else argmax)
    out.image_rows = image_rows
    return out


def scored_by_teacher_forcing(
    decoder: Decoder, feats: torch.Tensor, samples: SampledCaptions, bos_id: int
) -> torch.Tensor:
    """Each sampled caption's log-probability (R,), with gradients, from one teacher-forced pass over
    feats (B, N, D): the numbers `sample_captions` records, cheaper on the CPU."""
    R = samples.tokens.shape[0]
    lengths = samples.lengths.cpu()  # (R,): positions per caption, at least 1
    lengths, order = lengths.sort(descending=True, stable=True)  # (R,) each: longest first, for the LSTM
    steps = int(lengths[0])
    targets = samples.tokens.index_select(0, order)[:, :steps]  # (R, steps)
    inputs = torch.cat([targets.new_full((R, 1), bos_id), targets[:, :-1]], dim=1)  # (R, steps): <bos>, then the words
    out = decoder(feats, inputs, lengths, image_rows=samples.image_rows.index_select(0, order), packed=True)
    if out.positions is None:  # (R, steps, V), padding included: keep the real positions
        positions = real_positions(lengths, steps, out.logits.device)  # (M,)
        logits = out.logits.flatten(0, 1).index_select(0, positions)  # (M, V)
    else:
        positions, logits = out.positions, out.logits  # (M,), (M, V)
    words = targets.flatten().index_select(0, positions)  # (M,)
    chosen = logits.float().log_softmax(dim=-1).gather(1, words[:, None]).squeeze(1)  # (M,)
    sorted_sums = chosen.new_zeros(R).index_add(0, positions // steps, chosen)  # (R,) in the sorted order
    return sorted_sums.new_zeros(R).index_copy(0, order, sorted_sums)  # (R,) in the samples' order


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
