"""Greedy decoding and batched beam search in numpy, over any decoder step given as a function.

The loops of `captioner.models.decoding` (`roll_out` as greedy decoding, beam_search_n_best with one
group) behind the same `decode_hypotheses`, again in numpy so the runtime loads no torch: the same
rules, length penalty, stopping rule and float32 sums, so the same step numbers give the same captions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from captioner.core.decode_results import Hypothesis, length_penalty
from captioner.core.decode_schema import check_search

Arrays = dict[str, np.ndarray]
# memory, prev_tokens (R,), state -> logprobs (R, V), attn (R, L, H, N), next state
StepFunction = Callable[[Arrays, np.ndarray, Arrays], tuple[np.ndarray, np.ndarray, Arrays]]

NEG_INF = np.float32(-np.inf)


@dataclass(frozen=True)
class TokenRules:
    """The ids a search treats apart: captions start at `bos`, end at `eos`."""

    bos: int
    eos: int
    banned: np.ndarray  # (V,) bool: ids never produced (<pad>, <bos>, <unk>)
    bad_endings: np.ndarray  # (V,) bool: words a caption may not end on (`suppress_bad_endings`)


@dataclass(frozen=True)
class SearchOptions:
    beam_size: int
    max_length: int
    length_penalty: float
    block_trigrams: bool
    min_length: int
    suppress_bad_endings: bool


def apply_rules(logprobs: np.ndarray, history: np.ndarray, rules: TokenRules, options: SearchOptions) -> np.ndarray:
    """logprobs (R, V) with -inf at the banned ids, and at <eos> before `min_length` words or after a
    bad ending (`suppress_bad_endings`); history (R, t): the words so far."""
    logprobs = np.where(rules.banned, NEG_INF, logprobs.astype(np.float32, copy=False))  # (R, V)
    t = history.shape[1]
    if t < options.min_length:
        logprobs[:, rules.eos] = NEG_INF
    elif options.suppress_bad_endings and t > 0:
        logprobs[rules.bad_endings[history[:, -1]], rules.eos] = NEG_INF
    return logprobs


def block_repeated_trigrams(logprobs: np.ndarray, history: np.ndarray) -> np.ndarray:
    """-inf at every word w that would repeat a trigram (a, b, w) of its row; logprobs (R, V), history (R, t)."""
    if history.shape[1] < 3:
        return logprobs
    last = history[:, -2:]  # (R, 2)
    match = (history[:, :-2] == last[:, :1]) & (history[:, 1:-1] == last[:, 1:])  # (R, t-2): (a, b) at i, i+1
    rows, starts = np.nonzero(match)
    blocked = logprobs.copy()
    blocked[rows, history[rows, starts + 2]] = NEG_INF
    return blocked


def decode_hypotheses(
    step: StepFunction, memory: Arrays, state: Arrays, rules: TokenRules, options: SearchOptions, n_best: int = 1
) -> list[list[Hypothesis]]:
    """Per image its `n_best` hypotheses, best first: greedy when the beam is 1, else beam search."""
    if options.beam_size <= 1:
        return [[h] for h in greedy_search(step, memory, state, rules, options)]
    return beam_search_n_best(step, memory, state, rules, options, n_best)


def greedy_search(
    step: StepFunction, memory: Arrays, state: Arrays, rules: TokenRules, options: SearchOptions
) -> list[Hypothesis]:
    """The most probable allowed word at each step for every row, until all ended or max_length;
    the score is the log-probability of the words and the <eos>."""
    batch = len(next(iter(memory.values())))
    prev = np.full(batch, rules.bos, dtype=np.int64)  # (B,)
    logprob = np.zeros(batch, dtype=np.float32)  # (B,)
    history = np.zeros((batch, 0), dtype=np.int64)  # (B, t)
    done = np.zeros(batch, dtype=bool)  # (B,)
    maps = []
    for _ in range(options.max_length):
        logprobs, attn, state = step(memory, prev, state)  # (B, V), (B, L, H, N)
        logprobs = apply_rules(logprobs, history, rules, options)  # (B, V)
        allowed = block_repeated_trigrams(logprobs, history) if options.block_trigrams else logprobs  # (B, V)
        prev = allowed.argmax(axis=1)  # (B,)
        logprob += np.where(done, np.float32(0.0), logprobs[np.arange(batch), prev])
        history = np.concatenate([history, prev[:, None]], axis=1)  # (B, t+1)
        maps.append(attn.astype(np.float32, copy=False))
        done |= prev == rules.eos
        if done.all():
            break
    attn_bt = np.stack(maps, axis=1)  # (B, T, L, H, N)
    lengths = np.where(done, (history == rules.eos).argmax(axis=1), options.max_length)  # (B,): words before <eos>
    scores = logprob.tolist()
    return [
        Hypothesis(history[b, :n].tolist(), scores[b], scores[b], attn_bt[b, :n], bool(done[b]))
        for b, n in enumerate(lengths)
    ]


def top_descending(values: np.ndarray, k: int) -> np.ndarray:
    """Column indices of each row's k largest values, largest (then lower index) first; (R, M) -> (R, k)."""
    k = min(k, values.shape[1])
    part = np.argpartition(-values, k - 1, axis=1)[:, :k]  # (R, k), unordered
    top = np.take_along_axis(values, part, axis=1)  # (R, k)
    kth = top.min(axis=1, keepdims=True)  # (R, 1): the k-th largest value
    # argpartition keeps any of the values tied with the k-th: where it left one out, that row is sorted stably,
    # so that ties go to the lower index as in torch's loops and the page's search (deploy/web/search.js).
    for row in np.nonzero((values == kth).sum(axis=1) > (top == kth).sum(axis=1))[0]:
        part[row] = np.argsort(-values[row], kind="stable")[:k]
    order = np.lexsort((part, -np.take_along_axis(values, part, axis=1)), axis=1)  # (R, k): by value, then index
    return np.take_along_axis(part, order, axis=1)  # (R, k)


class BeamHistory:
    """Each step's attention maps and back-pointers: a beam's maps are read back once, when it
    becomes a hypothesis, not copied at every reordering."""

    def __init__(self) -> None:
        self.maps: list[np.ndarray] = []  # per step (R, L, H, N), rows as after that step's reordering
        self.parents: list[np.ndarray] = []  # per step (R,): the row each beam came from

    def append(self, attn: np.ndarray, rows: np.ndarray) -> None:
        self.maps.append(attn[rows])  # (R, L, H, N)
        self.parents.append(rows)

    def attention(self, row: int, shape: tuple[int, ...]) -> np.ndarray:
        """(t, L, H, N): the maps of the beam in `row` after the last step, first word first."""
        maps = []
        for step in range(len(self.maps) - 1, -1, -1):
            maps.append(self.maps[step][row])
            row = int(self.parents[step][row])
        return np.stack(maps[::-1]) if maps else np.zeros((0, *shape), dtype=np.float32)  # (t, L, H, N)


def beam_search(
    step: StepFunction, memory: Arrays, state: Arrays, rules: TokenRules, options: SearchOptions
) -> list[Hypothesis]:
    """The best hypothesis of each image's `beam_search_n_best`."""
    return [ranked[0] for ranked in beam_search_n_best(step, memory, state, rules, options, n_best=1)]


def beam_search_n_best(
    step: StepFunction, memory: Arrays, state: Arrays, rules: TokenRules, options: SearchOptions, n_best: int = 1
) -> list[list[Hypothesis]]:
    """Per image its `n_best` (<= beam_size) best distinct hypotheses, best first. Each step keeps each
    image's top 2K of K*V continuations: an <eos> in the top K finishes, the best K others stay live;
    an image is done once no live beam can beat K finished ones (torch's rule)."""
    check_search({"beam_size": options.beam_size, "n_best": n_best})
    B = len(next(iter(memory.values())))
    K, max_length, alpha, eos = options.beam_size, options.max_length, options.length_penalty, rules.eos
    memory = {k: np.repeat(v, K, axis=0) for k, v in memory.items()}  # (B*K, ...): image b's beams: rows b*K..b*K+K-1
    state = {k: np.repeat(v, K, axis=0) for k, v in state.items()}  # (B*K, ...)
    prev = np.full(B * K, rules.bos, dtype=np.int64)  # (B*K,)
    scores = np.full((B, K), NEG_INF, dtype=np.float32)  # (B, K)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    history = np.zeros((B * K, 0), dtype=np.int64)  # (B*K, t)
    beams = BeamHistory()
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    done = [False] * B
    best_possible_penalty = length_penalty(max_length, alpha)
    map_shape: tuple[int, ...] = ()

    for t in range(max_length):
        logprobs, attn, state = step(memory, prev, state)  # (B*K, V), (B*K, L, H, N)
        attn = attn.astype(np.float32, copy=False)
        map_shape = attn.shape[1:]
        logprobs = apply_rules(logprobs, history, rules, options)  # (B*K, V)
        if options.block_trigrams:
            logprobs = block_repeated_trigrams(logprobs, history)
        V = logprobs.shape[1]
        candidates = (scores.reshape(B * K, 1) + logprobs).reshape(B, K * V)  # (B, K*V): true log-probabilities
        top_index = top_descending(candidates, 2 * K)  # (B, 2K)
        top_scores = np.take_along_axis(candidates, top_index, axis=1)  # (B, 2K)
        top_beam, top_token = top_index // V, top_index % V  # (B, 2K) each
        is_eos = top_token == eos  # (B, 2K)

        # Finished hypotheses: <eos> within the top K of a search still going on.
        for b, j in np.argwhere(is_eos[:, :K] & np.isfinite(top_scores[:, :K])):
            if done[b]:
                continue
            row = b * K + int(top_beam[b, j])
            raw = float(top_scores[b, j])
            maps = beams.attention(row, map_shape)  # (t, L, H, N)
            finished[b].append(Hypothesis(history[row].tolist(), raw / length_penalty(t, alpha), raw, maps, True))

        # Live beams: the best K candidates of each image that do not end here.
        not_ending = np.where(is_eos, NEG_INF, top_scores)  # (B, 2K)
        live_pos = top_descending(not_ending, K)  # (B, K)
        live_beam = np.take_along_axis(top_beam, live_pos, axis=1)  # (B, K)
        live_token = np.take_along_axis(top_token, live_pos, axis=1)  # (B, K)
        scores = np.take_along_axis(not_ending, live_pos, axis=1)  # (B, K): -inf where none is left
        rows = (np.arange(B)[:, None] * K + live_beam).reshape(-1)  # (B*K,)
        state = {k: np.take(v, rows, axis=0) for k, v in state.items()}
        history = np.concatenate([history[rows], live_token.reshape(-1, 1)], axis=1)  # (B*K, t+1)
        beams.append(attn, rows)
        prev = live_token.reshape(-1)  # (B*K,)

        best_live = scores.max(axis=1).tolist()  # (B,)
        for b in range(B):
            if not done[b] and len(finished[b]) >= K:
                worst = sorted(h.score for h in finished[b])[-K]
                done[b] = worst >= best_live[b] / best_possible_penalty
        if all(done):
            break

    return best_hypotheses(finished, done, scores, history, beams, map_shape, alpha, n_best)


def best_hypotheses(
    finished: list[list[Hypothesis]], done: list[bool], scores: np.ndarray, history: np.ndarray, beams: BeamHistory,
    map_shape: tuple[int, ...], alpha: float, n_best: int,
) -> list[list[Hypothesis]]:
    """Per image its `n_best` best distinct hypotheses: the finished ones and, for an image cut off at
    max_length, its live beams (scores (B, K), history (B*K, t)) on the same penalised score."""
    B, K = scores.shape
    live_scores = scores.reshape(B * K).tolist()  # (B*K,)
    live_penalty = length_penalty(history.shape[1], alpha)
    results = []
    for b in range(B):
        pool = list(finished[b])
        if not done[b]:
            for row in range(b * K, (b + 1) * K):
                raw = live_scores[row]
                if raw != float("-inf"):
                    maps = beams.attention(row, map_shape)  # (t, L, H, N)
                    pool.append(Hypothesis(history[row].tolist(), raw / live_penalty, raw, maps, False))
        ranked: dict[tuple[int, ...], Hypothesis] = {}
        for hyp in sorted(pool, key=lambda h: -h.score):
            ranked.setdefault(tuple(hyp.tokens), hyp)  # keep each caption once, at its best
        results.append(list(ranked.values())[:n_best])
    return results
