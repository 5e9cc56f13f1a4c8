"""Sampling for self-critical training (SCST): captions drawn with the log-probabilities the
policy gradient needs, and the greedy baseline, as padded device tensors.

`roll_out` steps every row for exactly `max_length` steps and reads nothing back from the
device (static bounds, for GPUs and gradients); on the CPU without gradients
`shrinking_roll_out` drops ended rows and stops early, for the same captions. `draw` and
`restrict_to_top` (temperature, top-k, nucleus) are also the inference's sampling
(`search.sample_n_best`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from captioner.core.decode_schema import check_options
from captioner.models.decoder import reads_are_free, real_positions, select_rows
from captioner.models.decoding.rules import EndingRule, apply_ending_rule, banned_mask, block_repeated_trigrams
from captioner.models.decoding.stepping import SHRINK_SHARE
from captioner.models.products import reused_weights

if TYPE_CHECKING:
    from captioner.models.decoder import Decoder


def restrict_to_top(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Keep the `top_k` most probable words (0: all), then the nucleus: the fewest words, most
    probable first, whose probability reaches `top_p` (Holtzman et al. 2020); the rest get -inf.

    logits (R, V) are the (temperature-scaled) scores the sample is drawn from.
    """
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
    logprobs: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One word per row from softmax(logprobs / temperature), restricted to top-k / top-p; (R, V) -> (R,)."""
    logits = restrict_to_top(logprobs.detach().float() / temperature, top_k, top_p)  # (R, V)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(1)  # (R,)


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """The sampling options of a direct call (self-critical training), judged by the schema as
    DecodeOptions judges them: the same one-line ConfigError."""
    check_options({"temperature": temperature, "top_k": top_k, "top_p": top_p})


@dataclass
class SampledCaptions:
    """n sampled captions per image, padded; rows b*n .. b*n+n-1 belong to image b."""

    tokens: torch.Tensor  # (B*n, T) long: word ids, then <eos> where the caption ended, then 0
    logprobs: torch.Tensor  # (B*n, T) float, with grad: the model's log-probability of each token
    mask: torch.Tensor  # (B*n, T) bool: true at the words and the <eos>, false after
    lengths: torch.Tensor  # (B*n,) long: true positions per row (words, plus 1 when it ended)
    image_rows: torch.Tensor  # (B*n,) long: the image each caption describes

    def caption_logprobs(self) -> torch.Tensor:
        """(B*n,) each caption's log-probability: its words and its <eos>."""
        return (self.logprobs * self.mask).sum(dim=1)  # (B*n,)

@reused_weights()  # the dense layers' weights reordered once for the whole loop
def roll_out(
    decoder: Decoder,
    memory: dict[str, torch.Tensor],
    bos_id: int,
    eos_id: int,
    max_length: int,
    pick: Callable[[torch.Tensor], torch.Tensor],
    banned: tuple[int, ...] = (),
    block_trigrams: bool = False,
    ending: EndingRule | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode every row of `memory` for exactly `max_length` steps, choosing each word with
    `pick(allowed logprobs (R, V)) -> (R,)`; `ending` says when <eos> may be chosen. Static
    bounds: rows that ended keep stepping on <pad> with their positions masked, and nothing is
    read back from the device (no early exit). On the CPU without gradients, where reading a
    value costs nothing, `shrinking_roll_out` returns the same for less work.

    Returns tokens (R, T) (words, <eos> where ended, then 0), the model's log-probability of each
    (R, T) (0 where masked; with gradients when enabled) and mask (R, T), T = max_length."""
    R = next(iter(memory.values())).shape[0]
    device = next(iter(memory.values())).device
    if reads_are_free(device) and not torch.is_grad_enabled():
        return shrinking_roll_out(decoder, memory, bos_id, eos_id, max_length, pick, banned, block_trigrams, ending)
    state = decoder.init_state(memory, capacity=max_length)
    prev = torch.full((R,), bos_id, dtype=torch.long, device=device)  # (R,)
    done = torch.zeros(R, dtype=torch.bool, device=device)  # (R,)
    history = torch.zeros((R, max_length), dtype=torch.long, device=device)  # (R, T), filled step by step
    chosen_logprobs, masks = [], []
    forbidden = banned_mask(banned, decoder.vocab_size, device)  # (V,)
    for t in range(max_length):
        logprobs, _, state = decoder.step(memory, prev, state)  # (R, V)
        logprobs = logprobs.float()
        allowed = apply_ending_rule(ending, logprobs.detach().masked_fill(forbidden, float("-inf")), prev, t)  # (R, V)
        if block_trigrams:
            allowed = block_repeated_trigrams(allowed, history[:, :t])
        token = pick(allowed).masked_fill(done, 0)  # (R,)
        chosen_logprobs.append(logprobs.gather(1, token[:, None]).squeeze(1).masked_fill(done, 0.0))  # (R,)
        masks.append(~done)  # this position is a word or the <eos>
        history[:, t] = token
        done = done | (token == eos_id)
        prev = token
    return history, torch.stack(chosen_logprobs, dim=1), torch.stack(masks, dim=1)  # (R, T) each


@reused_weights()
def shrinking_roll_out(
    decoder: Decoder,
    memory: dict[str, torch.Tensor],
    bos_id: int,
    eos_id: int,
    max_length: int,
    pick: Callable[[torch.Tensor], torch.Tensor],
    banned: tuple[int, ...] = (),
    block_trigrams: bool = False,
    ending: EndingRule | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`roll_out` for the host, without gradients: rows that have ended leave the batch (memory and
    state cut to the rest) once there are enough of them to pay for the copy, and the loop stops
    when every row has ended. Same returns as `roll_out`; with a deterministic `pick` the same
    values. A random `pick` draws for fewer rows, so its draws differ from `roll_out`'s (same
    distribution). Self-critical samples end after about half of their 20 steps, so this does about
    half of the decoding work."""
    R = next(iter(memory.values())).shape[0]
    history = torch.zeros((R, max_length), dtype=torch.long)  # (R, T)
    chosen = torch.zeros((R, max_length))  # (R, T)
    mask = torch.zeros((R, max_length), dtype=torch.bool)  # (R, T)
    rows = torch.arange(R)  # (A,): the row of each row still stepping
    done = torch.zeros(R, dtype=torch.bool)  # (A,)
    state = decoder.init_state(memory, capacity=max_length)
    prev = torch.full((R,), bos_id, dtype=torch.long)  # (A,)
    forbidden = banned_mask(banned, decoder.vocab_size, torch.device("cpu"))  # (V,)
    for t in range(max_length):
        logprobs, _, state = decoder.step(memory, prev, state)  # (A, V)
        logprobs = logprobs.float()
        allowed = apply_ending_rule(ending, logprobs.masked_fill(forbidden, float("-inf")), prev, t)  # (A, V)
        if block_trigrams:
            allowed = block_repeated_trigrams(allowed, history.index_select(0, rows)[:, :t])  # (A, V)
        token = pick(allowed).masked_fill(done, 0)  # (A,)
        history[rows, t] = token
        chosen[rows, t] = logprobs.gather(1, token[:, None]).squeeze(1).masked_fill(done, 0.0)
        mask[rows, t] = ~done
        done = done | (token == eos_id)
        prev = token
        ended = int(done.sum())
        if ended == len(rows):
            break
        if ended * SHRINK_SHARE >= len(rows):
            keep = (~done).nonzero().squeeze(1)  # (A',)
            rows, prev, done = rows[keep], prev[keep], done[keep]
            memory, state = select_rows(memory, keep), select_rows(state, keep)
    return history, chosen, mask


def sample_captions(
    decoder: Decoder,
    feats: torch.Tensor,
    bos_id: int,
    eos_id: int,
    n: int,
    max_length: int,
    temperature: float = 1.0,
    banned: tuple[int, ...] = (),
    top_k: int = 0,
    top_p: float = 1.0,
    block_trigrams: bool = False,
    generator: torch.Generator | None = None,
    ending: EndingRule | None = None,
) -> SampledCaptions:
    """Sample n captions per image with gradients, for self-critical training; feats (B, N, D).

    The memory is prepared once per image and expanded n times. Words are drawn from
    softmax(logprobs / temperature), with `banned` ids (<pad>, <bos>, <unk>) never drawn and
    optionally top-k / nucleus restriction and trigram blocking. The recorded log-probability is
    the model's own log-softmax at temperature 1, as in Rennie et al. 2017 and Luo 2020: the
    policy the gradient pushes is the model, the same distribution cross-entropy trains and beam
    search scores, so a sample's log-probability equals the teacher-forced one of its tokens.
    (At temperature 1 with no restriction this is also the distribution sampled from.) Rows
    that have ended produce <pad> (0) with mask false, and carry no log-probability. T =
    max_length. With gradients, or on a GPU, the loop runs all `max_length` steps and never asks
    the device whether all rows ended; on the CPU without gradients (SCST's sampling there, scored
    afterwards by `scored_by_teacher_forcing`) ended rows leave the batch (`shrinking_roll_out`).
    """
    check_sampling(temperature, top_k, top_p)
    B, device = feats.shape[0], feats.device
    image_rows = torch.arange(B, device=device).repeat_interleave(n)  # (B*n,)
    memory = select_rows(decoder.prepare(feats), image_rows)  # (B*n, ...) per-image constants
    tokens, logprobs, mask = roll_out(
        decoder, memory, bos_id, eos_id, max_length, lambda allowed: draw(allowed, temperature, top_k, top_p, generator),
        banned, block_trigrams, ending,
    )  # (B*n, T) each
    return SampledCaptions(tokens, logprobs, mask, mask.sum(dim=1), image_rows)


def scored_by_teacher_forcing(decoder: Decoder, feats: torch.Tensor, samples: SampledCaptions, bos_id: int) -> torch.Tensor:
    """Each sampled caption's log-probability (its words and <eos>), (R,), with gradients, from one
    teacher-forced pass: the numbers `sample_captions` records step by step with gradients (the
    same model's log-softmax at the same tokens), for a fraction of the work on the CPU, with no
    graph through the roll-out and nothing computed for rows that have ended. feats (B, N, D).

    It reads `samples.lengths` on the host, so it is for CPU tensors: on a GPU that read would
    wait for the device, and the step-by-step record keeps the step free of synchronisations."""
    R = samples.tokens.shape[0]
    lengths = samples.lengths.cpu()  # (R,): positions per caption, at least 1
    lengths, order = lengths.sort(descending=True, stable=True)  # (R,) each: longest first, as the LSTM wants them
    steps = int(lengths[0])
    targets = samples.tokens.index_select(0, order)[:, :steps]  # (R, steps)
    inputs = torch.cat([targets.new_full((R, 1), bos_id), targets[:, :-1]], dim=1)  # (R, steps): <bos>, then the words
    out = decoder(feats, inputs, lengths, image_rows=samples.image_rows.index_select(0, order), packed=True)
    if out.positions is None:  # (R, steps, V), padding included: keep the real positions
        positions = real_positions(lengths, steps, out.logits.device)  # (M,)
        logits = out.logits.flatten(0, 1).index_select(0, positions)  # (M, V)
    else:
        positions, logits = out.positions, out.logits  # (M,), (M, V)
    chosen = logits.float().log_softmax(dim=-1).gather(1, targets.flatten().index_select(0, positions)[:, None]).squeeze(1)  # (M,)
    sorted_sums = chosen.new_zeros(R).index_add(0, positions // steps, chosen)  # (R,) in the sorted order
    return sorted_sums.new_zeros(R).index_copy(0, order, sorted_sums)  # (R,) in the samples' order

@torch.no_grad()
def greedy_captions(
    decoder: Decoder, feats: torch.Tensor, bos_id: int, eos_id: int, max_length: int, banned: tuple[int, ...] = (),
    ending: EndingRule | None = None,
) -> SampledCaptions:
    """The greedy caption of each image as device tensors (SCST's greedy baseline); feats (B, N, D).

    The same words as `greedy_decode` (argmax, `banned` never produced), without its attention
    maps or host copies: on a device `max_length` steps, rows that ended masked, no early exit
    (on the CPU `shrinking_roll_out` does exit early). T = max_length either way."""
    B = feats.shape[0]
    tokens, logprobs, mask = roll_out(
        decoder, decoder.prepare(feats), bos_id, eos_id, max_length, lambda allowed: allowed.argmax(dim=-1), banned,
        ending=ending,
    )  # (B, T) each
    return SampledCaptions(tokens, logprobs, mask, mask.sum(dim=1), torch.arange(B, device=feats.device))
