"""Greedy decoding, sampling and batched beam search, through the decoder interface alone.

Nothing here knows which decoder it drives: it calls `prepare`, `init_state` and `step`, and
reorders memory and state with `select_rows`. Every function decodes a whole batch of images at
once. The inference decoders return, per image, the word ids, the score and the attention map of
every word; `sample_captions` returns padded token tensors whose log-probabilities carry
gradients, for self-critical training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from captioner.models.decoder import Decoder


@dataclass
class Hypothesis:
    tokens: list[int]  # word ids, without <bos> and <eos>
    score: float  # total log-probability, divided by the length penalty
    logprob: float  # total log-probability, <eos> included when the caption ended
    attn: torch.Tensor  # (T, L, H, N): the attention at each word
    finished: bool  # False when max_length was reached before <eos>


def select_rows(tensors: dict[str, torch.Tensor], index: torch.Tensor) -> dict[str, torch.Tensor]:
    """Pick rows of every batch-first tensor of a memory or state: beam expansion and reordering."""
    return {key: value.index_select(0, index) for key, value in tensors.items()}


def ban(logprobs: torch.Tensor, banned: tuple[int, ...]) -> torch.Tensor:
    if not banned:
        return logprobs
    logprobs = logprobs.clone()
    logprobs[:, list(banned)] = float("-inf")
    return logprobs


def block_repeated_trigrams(logprobs: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    """Forbid every word that would repeat a trigram already in its row's caption.

    logprobs (R, V); history (R, t) the words so far. A word w is blocked when the last two words
    (a, b) already occur as (a, b, w) earlier in the row: the same rule in beam search, greedy
    decoding and sampling.
    """
    t = history.shape[1]
    if t < 3:
        return logprobs
    last = history[:, -2:]  # (R, 2)
    match = (history[:, :-2] == last[:, :1]) & (history[:, 1:-1] == last[:, 1:])  # (R, t-2): (a, b) at i, i+1
    blocked = torch.zeros_like(logprobs, dtype=torch.float).scatter_add_(1, history[:, 2:], match.float())  # (R, V)
    return logprobs.masked_fill(blocked > 0, float("-inf"))


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
    if not temperature > 0:
        raise ValueError(f"sampling temperature must be > 0; got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 keeps every word); got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1]; got {top_p}")


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's ((5 + length) / 6) ** alpha; alpha = 0 ranks by total log-probability."""
    return ((5.0 + length) / 6.0) ** alpha


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
) -> SampledCaptions:
    """Sample n captions per image with gradients, for self-critical training; feats (B, N, D).

    The memory is prepared once per image and expanded n times. Words are drawn from
    softmax(logprobs / temperature), with `banned` ids (<pad>, <bos>, <unk>) never drawn and
    optionally top-k / nucleus restriction and trigram blocking. The recorded log-probability is
    the model's own log-softmax at temperature 1, as in Rennie et al. 2017 and Luo 2020: the
    policy the gradient pushes is the model, the same distribution cross-entropy trains and beam
    search scores, so a sample's log-probability equals the teacher-forced one of its tokens.
    (At temperature 1 with no restriction this is also the distribution sampled from.) Rows
    that have ended produce <pad> (0) with mask false, and carry no log-probability.
    """
    check_sampling(temperature, top_k, top_p)
    B, device = feats.shape[0], feats.device
    image_rows = torch.arange(B, device=device).repeat_interleave(n)  # (B*n,)
    memory = select_rows(decoder.prepare(feats), image_rows)  # (B*n, ...) per-image constants
    state = decoder.init_state(memory)
    prev = torch.full((B * n,), bos_id, dtype=torch.long, device=device)  # (B*n,)
    done = torch.zeros(B * n, dtype=torch.bool, device=device)  # (B*n,)
    history = torch.empty((B * n, 0), dtype=torch.long, device=device)  # (B*n, t)
    chosen_logprobs, masks = [], []
    for _ in range(max_length):
        logprobs, _, state = decoder.step(memory, prev, state)  # (B*n, V)
        logprobs = logprobs.float()
        allowed = ban(logprobs.detach(), banned)  # (B*n, V)
        if block_trigrams:
            allowed = block_repeated_trigrams(allowed, history)
        token = draw(allowed, temperature, top_k, top_p, generator)  # (B*n,)
        live = ~done  # (B*n,): this position is a word or the <eos>
        token = token.masked_fill(done, 0)
        chosen_logprobs.append(logprobs.gather(1, token[:, None]).squeeze(1).masked_fill(done, 0.0))  # (B*n,)
        masks.append(live)
        history = torch.cat([history, token[:, None]], dim=1)  # (B*n, t+1)
        done = done | (token == eos_id)
        prev = token
        if bool(done.all()):
            break
    mask = torch.stack(masks, dim=1)  # (B*n, T)
    return SampledCaptions(history, torch.stack(chosen_logprobs, dim=1), mask, mask.sum(dim=1), image_rows)


@torch.no_grad()
def greedy_decode(
    decoder: Decoder,
    feats: torch.Tensor,
    bos_id: int,
    eos_id: int,
    max_length: int = 30,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    banned: tuple[int, ...] = (),
) -> list[Hypothesis]:
    """The most probable word at each step (or a sample at `temperature` > 0); feats (B, N, D).

    `banned` ids (<pad>, <bos>) are never produced: they are not words, and a caption's words
    must line up one to one with its attention maps."""
    batch = feats.shape[0]
    memory = decoder.prepare(feats)
    state = decoder.init_state(memory)
    prev = torch.full((batch,), bos_id, dtype=torch.long, device=feats.device)  # (B,)
    tokens, maps, logprob = [], [], torch.zeros(batch, device=feats.device)
    done = torch.zeros(batch, dtype=torch.bool, device=feats.device)  # (B,)
    lengths = torch.full((batch,), max_length, dtype=torch.long)
    for t in range(max_length):
        logprobs, attn, state = decoder.step(memory, prev, state)  # (B, V), (B, L, H, N)
        logprobs = ban(logprobs, banned)
        if temperature > 0:
            probs = (logprobs.float() / temperature).softmax(dim=-1)
            prev = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (B,)
        else:
            prev = logprobs.argmax(dim=-1)  # (B,)
        logprob += torch.where(done, 0.0, logprobs.gather(1, prev[:, None]).squeeze(1).float())
        tokens.append(prev)
        maps.append(attn)
        ended = (prev == eos_id) & ~done
        lengths[ended.cpu()] = t
        done |= ended
        if bool(done.all()):
            break
    tokens_bt = torch.stack(tokens, dim=1).cpu()  # (B, T)
    attn_bt = torch.stack(maps, dim=1).float().cpu()  # (B, T, L, H, N)
    results = []
    for b in range(batch):
        n = int(lengths[b])
        results.append(
            Hypothesis(tokens_bt[b, :n].tolist(), float(logprob[b]), float(logprob[b]), attn_bt[b, :n], bool(done[b]))
        )
    return results


@torch.no_grad()
def beam_search(
    decoder: Decoder,
    feats: torch.Tensor,
    bos_id: int,
    eos_id: int,
    beam_size: int = 3,
    max_length: int = 30,
    alpha: float = 0.0,
    banned: tuple[int, ...] = (),
) -> list[Hypothesis]:
    """Batched beam search over B images with K beams each; feats (B, N, D).

    Each step ranks K*V continuations per image and keeps the top 2K: those ending in <eos> that
    rank within the top K become finished hypotheses; the best K others stay live. An image is
    done once it has K finished hypotheses that no live beam can still beat. If no hypothesis
    of an image ends within `max_length` words, its best unfinished one is returned.
    """
    B, K, device = feats.shape[0], beam_size, feats.device
    expand = torch.arange(B, device=device).repeat_interleave(K)  # (B*K,): beams of image b are rows b*K..b*K+K-1
    memory = select_rows(decoder.prepare(feats), expand)  # per-image constants: expanded once, never reordered
    state = decoder.init_state(memory)
    prev = torch.full((B * K,), bos_id, dtype=torch.long, device=device)  # (B*K,)
    scores = torch.full((B, K), float("-inf"), device=device)  # (B, K)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    history = torch.empty((B * K, 0), dtype=torch.long, device=device)  # (B*K, t)
    attn_history: torch.Tensor | None = None  # (B*K, t, L, H, N)
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    done = [False] * B
    best_possible_penalty = length_penalty(max_length, alpha)

    for t in range(max_length):
        logprobs, attn, state = decoder.step(memory, prev, state)  # (B*K, V), (B*K, L, H, N)
        logprobs = ban(logprobs, banned)
        V = logprobs.shape[-1]
        attn = attn.float()
        candidates = (scores.view(B * K, 1) + logprobs.float()).view(B, K * V)  # (B, K*V)
        top_scores, top_index = candidates.topk(2 * K, dim=1)  # (B, 2K)
        top_beam, top_token = top_index // V, top_index % V  # (B, 2K) each
        is_eos = top_token == eos_id  # (B, 2K)

        # Finished hypotheses: <eos> within the top K of an image still searching.
        for b, j in (is_eos[:, :K] & torch.isfinite(top_scores[:, :K])).nonzero().tolist():
            if done[b]:
                continue
            row = b * K + int(top_beam[b, j])
            step_attn = attn[row : row + 1]  # (1, L, H, N)
            words_attn = step_attn[:0] if attn_history is None else attn_history[row]
            raw = float(top_scores[b, j])
            finished[b].append(Hypothesis(history[row].tolist(), raw / length_penalty(t, alpha), raw, words_attn.cpu(), True))

        # Live beams: the best K candidates that do not end here.
        live_scores, live_pos = top_scores.masked_fill(is_eos, float("-inf")).topk(K, dim=1)  # (B, K)
        live_beam = top_beam.gather(1, live_pos)  # (B, K)
        live_token = top_token.gather(1, live_pos)  # (B, K)
        rows = (torch.arange(B, device=device)[:, None] * K + live_beam).view(-1)  # (B*K,)
        state = select_rows(state, rows)
        history = torch.cat([history.index_select(0, rows), live_token.view(-1, 1)], dim=1)  # (B*K, t+1)
        step_attn = attn.index_select(0, rows).unsqueeze(1)  # (B*K, 1, L, H, N)
        attn_history = step_attn if attn_history is None else torch.cat([attn_history.index_select(0, rows), step_attn], dim=1)
        scores = live_scores
        prev = live_token.view(-1)

        for b in range(B):
            if not done[b] and len(finished[b]) >= K:
                worst = min(h.score for h in sorted(finished[b], key=lambda h: -h.score)[:K])
                done[b] = worst >= float(scores[b, 0]) / best_possible_penalty
        if all(done):
            break

    results = []
    for b in range(B):
        pool = finished[b]
        if not pool:  # nothing ended: the best unfinished beam, never a crash
            row = b * K
            raw = float(scores[b, 0])
            assert attn_history is not None
            pool = [Hypothesis(history[row].tolist(), raw / length_penalty(history.shape[1], alpha), raw, attn_history[row].cpu(), False)]
        results.append(max(pool, key=lambda h: h.score))
    return results
