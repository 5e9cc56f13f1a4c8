"""Greedy decoding, sampling and batched beam search, through the decoder interface alone.

Nothing here knows which decoder it drives: it calls `prepare`, `init_state` and `step`, and
reorders memory and state with `select_rows`. Every function decodes a whole batch of images at
once and returns, per image, the word ids, the score and the attention map of every word.
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


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's ((5 + length) / 6) ** alpha; alpha = 0 ranks by total log-probability."""
    return ((5.0 + length) / 6.0) ** alpha


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
