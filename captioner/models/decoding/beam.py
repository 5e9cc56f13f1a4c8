"""Batched (diverse) beam search (`beam_search_n_best`) and `Beam`: its state, and the steps that move it.

B images have K beams each, in G groups of Kg = K/G beams (one group is ordinary beam search);
search s = b*G + g holds rows s*Kg .. s*Kg+Kg-1 of the B*K. A step reads as the algorithm:

    candidates = beam.expand(t)        every live beam's continuations, scored, (B, G, Kg*V)
    choice = beam.select(candidates)   per group its best 2Kg: those ending, the Kg kept live
    beam.advance(choice)               the live beams move on (scores, words, decoder state)
    beam.finish(choice, t)             the endings become hypotheses; the searches that are done

The host reads the device once per step (`finish`), and the maps once (`best`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

from captioner.core.decode_results import Hypothesis, length_penalty
from captioner.core.decode_schema import check_search
from captioner.models.decoder import Decoder, select_rows
from captioner.models.decoding.rules import (
    SHRINK_SHARE, DecodeOptions, EndingRule, SpecialTokens, block_repeated_trigrams, device_index,
    pad_last, spread_rows, step_decoder,
)
from captioner.models.products import reused_weights

NEG_INF = float("-inf")


@dataclasses.dataclass
class Choice:
    """One step's choice, (S, Kg) each, S = B*G searches: which of each search's top Kg candidates end
    here (beam within the group, total log-probability), and the Kg kept live (-inf: none left)."""

    ends: torch.Tensor  # bool
    end_beam: torch.Tensor
    end_scores: torch.Tensor
    live_beam: torch.Tensor
    live_token: torch.Tensor
    live_scores: torch.Tensor


class Beam:
    """Every image's beams while the search runs; each search's finished hypotheses are (score,
    log-probability, row, words): the beam was `row` after its last word, and has `words` words."""

    def __init__(self, decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions) -> None:
        B, K, G, device = feats.shape[0], options.beam_size, options.diverse_groups, feats.device
        self.decoder, self.options, self.eos = decoder, options, special.eos
        self.B, self.K, self.G, self.Kg, self.S, self.device = B, K, G, K // G, B * G, device
        self.expand_rows = torch.arange(B, device=device).repeat_interleave(K)  # (B*K,): image b's rows b*K..
        self.per_image = decoder.prepare(feats)  # (B, ...) each: the per-image constants
        self.state = decoder.init_state(self.per_image, capacity=options.max_length)  # (B, ...) each: one row per image
        self.memory = decoder.expand_memory(self.per_image, K)  # expanded once (if at all), never reordered
        self.prev = torch.full((B,), special.bos, dtype=torch.long, device=device)  # (B,)
        self.scores = torch.full((B, G, self.Kg), NEG_INF, device=device)  # (B, G, Kg)
        self.scores[:, :, 0] = 0.0  # all beams of a group start identical: expand only the first
        self.history = torch.empty((B * K, 0), dtype=torch.long, device=device)  # (B*K, t): for trigram blocking
        self.step_maps: list[torch.Tensor] = []  # per step t: (B*K, L, H, N)
        self.step_self: list[torch.Tensor] = []  # per step t: (B*K, L, H, t+1), with self_attention
        self.parents: list[list[int]] = []  # per step: the row each live beam came from (its back-pointer)
        self.step_words: list[list[int]] = []  # per step: the word each live beam took
        self.finished: list[list[tuple[float, float, int, int]]] = [[] for _ in range(self.S)]
        self.done = [False] * self.S
        self.live: list[float] = []  # (B*K,) the live beams' log-probabilities after the last step
        self.best_possible_penalty = length_penalty(options.max_length, options.length_penalty)
        self.banned = device_index(sorted(set(special.banned)), device)  # (W,): their columns, filled in place
        self.ending = EndingRule.build(
            special, options.min_length, options.suppress_bad_endings, decoder.vocab_size, device
        )
        # On the CPU a step costs in proportion to its rows, so images whose searches are all done
        # leave the step (their rows come back dead, -inf); on a GPU every row is stepped to the end.
        self.shrink = device.type == "cpu"
        self.alive = list(range(B))  # the images whose beams are stepped
        self.stepped: torch.Tensor | None = None  # (A,) their rows among the B*K, in order; None: all of them
        self.place: torch.Tensor | None = None  # (B*K,): each row's place in the state (-1: none); None: its own
        self.rows = self.expand_rows  # (B*K,): each live beam's parent after the last step

    def expand(self, t: int) -> torch.Tensor:
        """Step the decoder once -> candidates (B, G, Kg*V): beam score + next word's log-probability."""
        B, BK = self.B, self.B * self.K
        prev = self.prev if self.stepped is None else self.prev.index_select(0, self.stepped)  # (A,)
        memory = self.memory if t else self.per_image
        logprobs, attn, self.state, self_w = step_decoder(
            self.decoder, memory, prev, self.state, self.options.self_attention
        )
        if t == 0:  # an image's K beams are one hypothesis until now: stepped once, then copied to each
            logprobs, attn = (
                logprobs.index_select(0, self.expand_rows), attn.index_select(0, self.expand_rows)
            )  # (B*K, ...)
            self.prev = self.prev.index_select(0, self.expand_rows)  # (B*K,)
            self.state = select_rows(self.state, self.expand_rows)  # (B*K, ...) each
            self_w = None if self_w is None else self_w.index_select(0, self.expand_rows)
        elif self.stepped is not None:  # back to all B*K rows, the done images' dead
            logprobs = spread_rows(logprobs, self.stepped, BK, NEG_INF)  # (B*K, V)
            attn = spread_rows(attn, self.stepped, BK, 0.0)  # (B*K, L, H, N)
            self_w = None if self_w is None else spread_rows(self_w, self.stepped, BK, 0.0)  # (B*K, L, H, t+1)
        # In place on the step's own fresh (B*K, V) output: each copy would be a new buffer per step. Only the
        # banned columns are written (a (V,) mask would read all B*K*V: 0.27 ms a step at 96 x 10,000).
        logprobs = logprobs.float().index_fill_(1, self.banned, NEG_INF)  # (B*K, V)
        if self.ending is not None:
            logprobs = self.ending.apply(logprobs, self.prev, t)
        if self.options.block_trigrams:
            logprobs = block_repeated_trigrams(logprobs, self.history)
        self.step_maps.append(attn.float())
        if self_w is not None:
            self.step_self.append(self_w.float())  # (B*K, L, H, t+1)
        return logprobs.add_(self.scores.view(BK, 1)).view(B, self.G, -1)  # (B, G, Kg*V): true log-probabilities

    def select(self, candidates: torch.Tensor) -> Choice:
        """Each group ranks its candidates (B, G, Kg*V) by log-probability minus `diversity_strength` x
        the earlier groups' beams that took the same word now (Hamming diversity, Vijayakumar et al.
        2018) and keeps its top 2Kg: <eos> within the top Kg ends, the best Kg others stay live."""
        B, G, Kg = self.B, self.G, self.Kg
        V = candidates.shape[-1] // Kg
        chosen = torch.zeros(B, V, device=self.device) if G > 1 else None  # (B, V): earlier groups' beams per word
        picks = []
        for g in range(G):
            group = candidates[:, g]  # (B, Kg*V)
            penalised = (
                group - self.options.diversity_strength * chosen.repeat(1, Kg) if chosen is not None and g else group
            )  # (B, Kg*V)
            top_key, top_index = penalised.topk(2 * Kg, dim=1)  # (B, 2Kg)
            top_scores = group.gather(1, top_index)  # (B, 2Kg)
            is_eos = top_index % V == self.eos  # (B, 2Kg)
            live_key, live_pos = top_key.masked_fill(is_eos, NEG_INF).topk(Kg, dim=1)  # (B, Kg) each
            if chosen is not None:  # later groups pay for these words
                chosen.scatter_add_(1, top_index.gather(1, live_pos) % V, (live_key > NEG_INF).float())
            picks.append((top_key, top_index, top_scores, is_eos, live_key, live_pos))
        # Few kernel launches: one group is already (S, ...), and a key is finite or -inf (never +inf),
        # so one comparison stands for isfinite.
        top_key, top_index, top_scores, is_eos, live_key, live_pos = (
            picks[0] if G == 1 else (torch.stack(x, dim=1).view(self.S, -1) for x in zip(*picks))
        )  # (S, 2Kg) each, (S, Kg) for the live ones
        top_beam, top_token = top_index // V, top_index % V  # (S, 2Kg) each: beam within the group, word
        return Choice(
            ends=is_eos[:, :Kg] & (top_key[:, :Kg] > NEG_INF),  # (S, Kg): <eos> within the top Kg
            end_beam=top_beam[:, :Kg],  # (S, Kg)
            end_scores=top_scores[:, :Kg],  # (S, Kg)
            live_beam=top_beam.gather(1, live_pos),  # (S, Kg)
            live_token=top_token.gather(1, live_pos),  # (S, Kg)
            live_scores=top_scores.gather(1, live_pos).masked_fill(live_key == NEG_INF, NEG_INF),  # (S, Kg)
        )

    def advance(self, choice: Choice) -> None:
        """The live beams take their words and follow their parents (on the CPU, `follow_parents`)."""
        Kg = self.Kg
        self.scores = choice.live_scores.view(self.B, self.G, Kg)  # (B, G, Kg): a filler stays dead
        self.rows = (torch.arange(self.S, device=self.device)[:, None] * Kg + choice.live_beam).view(-1)  # (B*K,)
        if not self.shrink:
            self.state = select_rows(self.state, self.rows)  # (B*K, ...) each
        if self.options.block_trigrams:
            self.history = torch.cat(
                [self.history.index_select(0, self.rows), choice.live_token.view(-1, 1)], dim=1
            )  # (B*K, t+1)
        self.prev = choice.live_token.view(-1)  # (B*K,)

    def finish(self, choice: Choice, t: int) -> None:
        """The step's one read of the device: endings become finished hypotheses, and a search is done
        once it has Kg finished ones that no live beam of it can still beat."""
        Kg, alpha = self.Kg, self.options.length_penalty
        # cat promotes the flags and ids to the scores' float32 itself (no conversion kernels);
        # float32 holds the scores and every id below 2**24 exactly.
        read = torch.cat(
            (choice.ends, choice.end_beam, choice.end_scores, choice.live_beam, choice.live_token, choice.live_scores),
            dim=1,
        ).tolist()  # (S, 6Kg)
        for s, r in enumerate(read):
            if not self.done[s]:
                for j in range(Kg):
                    if r[j]:
                        raw = r[2 * Kg + j]
                        self.finished[s].append((raw / length_penalty(t, alpha), raw, s * Kg + int(r[Kg + j]), t))
        self.parents.append([s * Kg + int(r[3 * Kg + i]) for s, r in enumerate(read) for i in range(Kg)])
        self.step_words.append([int(r[4 * Kg + i]) for r in read for i in range(Kg)])
        self.live = [r[5 * Kg + i] for r in read for i in range(Kg)]
        for s in range(self.S):
            if not self.done[s] and len(self.finished[s]) >= Kg:
                worst = sorted(h[0] for h in self.finished[s])[-Kg]
                self.done[s] = worst >= max(self.live[s * Kg : (s + 1) * Kg]) / self.best_possible_penalty

    def follow_parents(self) -> None:
        """On the CPU: the state follows each live beam's parent, and done images' rows go (SHRINK_SHARE)."""
        if not self.shrink:
            return
        B, G, K = self.B, self.G, self.K
        still = [b for b in self.alive if not all(self.done[b * G : (b + 1) * G])]
        held = self.place  # where the state holds each row now
        if (len(self.alive) - len(still)) * SHRINK_SHARE >= len(self.alive):
            self.alive = still
            self.stepped = device_index([b * K + j for b in self.alive for j in range(K)], self.device)  # (A,)
            self.memory = self.decoder.expand_memory(
                select_rows(self.per_image, device_index(self.alive, self.device)), K
            )
            self.place = torch.full((B * K,), -1, dtype=torch.long, device=self.device).index_copy_(
                0, self.stepped, torch.arange(len(self.stepped), device=self.device)
            )  # (B*K,)
        sources = self.rows if self.stepped is None else self.rows.index_select(0, self.stepped)  # (A,): full rows
        self.state = select_rows(
            self.state, sources if held is None else held.index_select(0, sources)
        )  # (A, ...) each

    def lineage(self, row: int, words: int) -> list[int]:
        """The rows, after steps 0..words-1, of the beam that is `row` after its last word."""
        rows = [0] * words
        for tau in reversed(range(words)):
            rows[tau] = row
            row = self.parents[tau][row]
        return rows

    def ranked(self, b: int, n_best: int) -> list[tuple[list[int], float, float, bool, list[int]]]:
        """Image b's `n_best` best distinct hypotheses as (tokens, score, log-probability, ended, lineage)."""
        G, Kg, steps = self.G, self.Kg, len(self.parents)
        live_penalty = length_penalty(steps, self.options.length_penalty)
        searches = range(b * G, (b + 1) * G)
        pool = [(*h, True) for s in searches for h in self.finished[s]]
        pool += [(self.live[row] / live_penalty, self.live[row], row, steps, False) for s in searches
                 if not self.done[s]  # a done search's finished hypotheses already beat every live beam
                 for row in range(s * Kg, (s + 1) * Kg) if self.live[row] != NEG_INF]
        ranked, seen = [], set()
        for score, raw, row, words, ended in sorted(pool, key=lambda h: -h[0]):
            if len(ranked) == n_best:
                break
            rows = self.lineage(row, words)
            tokens = [self.step_words[tau][r] for tau, r in enumerate(rows)]
            if tuple(tokens) not in seen:  # groups may meet on the same caption: keep it once
                seen.add(tuple(tokens))
                ranked.append((tokens, score, raw, ended, rows))
        return ranked

    def best(self, n_best: int) -> list[list[Hypothesis]]:
        """Per image its `n_best` hypotheses, best first, with their maps (copied to the host once)."""
        chosen = [self.ranked(b, n_best) for b in range(self.B)]
        steps, BK = len(self.parents), self.B * self.K
        lineages = [h[4] for ranked in chosen for h in ranked]
        at = device_index(
            [tau * BK + self.parents[tau][r] for rows in lineages for tau, r in enumerate(rows)], self.device
        )  # (W,)
        sizes = [len(rows) for rows in lineages]

        def picked(per_step: list[torch.Tensor]) -> Iterator[torch.Tensor]:
            """Each step's (B*K, ...) -> the rows of each hypothesis's lineage (t, ...), on the host."""
            return iter(torch.stack(per_step).flatten(0, 1).index_select(0, at).cpu().split(sizes))  # (t, ...) each

        maps = picked(self.step_maps)  # (t, L, H, N) each
        self_maps = picked([pad_last(w, steps) for w in self.step_self]) if self.step_self else None  # (t, L, H, steps)
        return [
            [Hypothesis(tokens, score, raw, next(maps), ended,
                        None if self_maps is None else next(self_maps)[..., : len(rows)])  # self_attn (t, L, H, t)
             for tokens, score, raw, ended, rows in ranked]
            for ranked in chosen
        ]


@torch.no_grad()
def beam_search(
    decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions
) -> list[Hypothesis]:
    """The best hypothesis per image of `beam_search_n_best`; feats (B, N, D)."""
    return [hyps[0] for hyps in beam_search_n_best(decoder, feats, special, dataclasses.replace(options, n_best=1))]


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
