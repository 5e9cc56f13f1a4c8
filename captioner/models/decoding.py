"""Greedy decoding, sampling and batched beam search, through the decoder interface alone.

Nothing here knows which decoder it drives: it calls `prepare`, `init_state`, `expand_memory`
and `step`, and reorders memory and state with `select_rows`. Every function decodes a whole batch of images at
once. The inference functions take the decoder, the features, the `SpecialTokens` and one
`DecodeOptions`, and return, per image, the word ids, the score and the attention map of every
word; `sample_captions` returns padded token tensors whose log-probabilities carry gradients,
for self-critical training.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from captioner.core.config import DecodeConfig
from captioner.core.decode_schema import OPTIONS as DECODE_OPTIONS
from captioner.core.decode_schema import check_options
from captioner.core.errors import ConfigError
from captioner.models.decoder import reads_are_free, real_positions, select_rows
from captioner.models.products import reused_weights
from captioner.text.endings import bad_ending_ids

if TYPE_CHECKING:
    from captioner.models.decoder import Decoder
    from captioner.text.vocab import Vocabulary

def _default(name: str) -> Any:
    return DECODE_OPTIONS[name].default


@dataclass(frozen=True)
class DecodeOptions:
    """Every choice of how to decode, checked once where it is made against the one declaration
    of the options (core/decode_schema.py: types, limits, the rules between them), so a bad value
    is the same one-line ConfigError here as in a config, on the command line or in the demo.
    `from_config` starts from a model's own `decode` section."""

    beam_size: int = _default("beam_size")  # 1: greedy decoding
    max_length: int = _default("max_length")  # words
    length_penalty: float = _default("length_penalty")  # alpha of ((5 + length) / 6) ** alpha
    block_trigrams: bool = _default("block_trigrams")  # never repeat a word trigram within a caption
    min_length: int = _default("min_length")  # words before <eos> is allowed (every mode)
    suppress_bad_endings: bool = _default("suppress_bad_endings")  # no <eos> right after "a", "with", "of", ...
    diverse_groups: int = _default("diverse_groups")  # diverse beam search: groups of beam_size / groups beams
    diversity_strength: float = _default("diversity_strength")  # lambda of the Hamming penalty between groups
    n_best: int = _default("n_best")  # hypotheses per image (beam search), or draws per image (sampling)
    sample: bool = _default("sample")  # draw words instead of searching; the options below apply only then
    temperature: float = _default("temperature")
    top_k: int = _default("top_k")  # draw from the k most probable words only (0: all)
    top_p: float = _default("top_p")  # draw from the nucleus of this mass only
    seed: int | None = _default("seed")  # for reproducible draws
    self_attention: bool = _default("self_attention")  # also return the decoder's self-attention weights (transformers)

    def __post_init__(self) -> None:
        checked = check_options({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        for name, value in checked.items():  # 3.0 -> 3: a whole number given as a float is kept as an int
            object.__setattr__(self, name, value)

    @classmethod
    def from_config(cls, config: DecodeConfig, **overrides: Any) -> DecodeOptions:
        """A model's `decode` section, then the caller's `overrides` by name; an override of
        None keeps the section's value (or the option's default)."""
        for name in overrides:
            if name not in DECODE_OPTIONS:
                close = difflib.get_close_matches(name, DECODE_OPTIONS, n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}?" if close else f"options: {', '.join(DECODE_OPTIONS)}"
                raise ConfigError(f"decode: unknown option {name!r} ({hint})")
        configured = {name: getattr(config, name) for name in DECODE_OPTIONS if hasattr(config, name)}
        given = {name: value for name, value in overrides.items() if value is not None}
        return cls(**{**configured, **given})


@dataclass(frozen=True)
class SpecialTokens:
    """The ids decoding treats apart: every caption starts from `bos` and ends at `eos`, and the
    `banned` ids (<pad>, <bos>, <unk>) are never produced, since they are not words and every
    word of a caption must line up with its own attention map. `bad_endings` are the ids of the
    words a caption must not end on (text/endings.py), for `suppress_bad_endings`."""

    bos: int
    eos: int
    banned: tuple[int, ...] = ()
    bad_endings: tuple[int, ...] = ()

    @classmethod
    def of(cls, vocab: Vocabulary) -> SpecialTokens:
        """A vocabulary's: <pad>, <bos>, <unk> banned (they are not words, and every word of a
        caption gets its own attention map), and its bad-ending words' ids."""
        return cls(vocab.bos_id, vocab.eos_id, (vocab.pad_id, vocab.bos_id, vocab.unk_id), bad_ending_ids(vocab.index))


@dataclass
class Hypothesis:
    tokens: list[int]  # word ids, without <bos> and <eos>
    score: float  # total log-probability, divided by the length penalty
    logprob: float  # total log-probability, <eos> included when the caption ended
    attn: torch.Tensor  # (T, L, H, N): the attention at each word
    finished: bool  # False when max_length was reached before <eos>
    # (T, L, H, T) when asked for: at word t, the decoder's self-attention over the input
    # positions 0..t (<bos>, then the words before t); zero on later positions.
    self_attn: torch.Tensor | None = None


def step_decoder(
    decoder: Decoder, memory: dict[str, torch.Tensor], prev: torch.Tensor, state: dict[str, torch.Tensor], self_attention: bool
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
    """One decoder step; with `self_attention` (for decoders that have it) also the weights its
    self-attention used at this step, (R, L, H, t+1), taken out of the state; else None."""
    if not (self_attention and decoder.has_self_attention):
        logprobs, attn, state = decoder.step(memory, prev, state)
        return logprobs, attn, state, None
    logprobs, attn, state = decoder.step(memory, prev, state, self_attention=True)  # type: ignore[call-arg]
    state = dict(state)
    return logprobs, attn, state, state.pop("self_attn")


def pad_last(x: torch.Tensor, size: int) -> torch.Tensor:
    """Zero-pad the last dimension of x to `size`."""
    return torch.nn.functional.pad(x, (0, size - x.shape[-1]))


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
    """The sampling options of a direct call (self-critical training), judged as DecodeOptions
    judges them; a ValueError with the same text."""
    for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if not DECODE_OPTIONS[name].allows(value):
            raise ValueError(DECODE_OPTIONS[name].refusal(value))


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


def banned_mask(banned: tuple[int, ...], vocab_size: int, device: torch.device) -> torch.Tensor:
    """(V,) bool, true at the ids never produced (every decoding function's `banned`; the ending
    rule's <eos> and bad-ending masks are made the same way): built once per decode, so that no
    step indexes a device tensor with a host list, and copied without blocking (a tensor made
    from a list on the device would wait for it)."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)  # (V,), made on the host
    mask[list(banned)] = True
    if torch.device(device).type == "cuda":  # pinned, so the copy does not wait for the GPU
        mask = mask.pin_memory()
    return mask.to(device, non_blocking=True)  # (V,)


@dataclass(frozen=True)
class EndingRule:
    """When <eos> may be chosen: not before `min_length` words, and with `bad_after` (V,) bool,
    not right after a word it marks (a caption ending on "a", "with", "of" ...).

    The same rule in greedy decoding, beam search, sampling and the SCST roll-out: it sets the
    <eos> column of the step's log-probabilities to -inf, where the banned ids are masked. The
    word count is the host's loop counter and the previous words index a device mask, so a
    step reads nothing back from the device. A caption that reaches max_length is still cut
    there; `DecodeOptions` keeps min_length <= max_length."""

    eos_column: torch.Tensor  # (V,) bool, true at <eos> only
    min_length: int = 0
    bad_after: torch.Tensor | None = None  # (V,) bool: no <eos> right after these words

    @classmethod
    def build(
        cls, special: SpecialTokens, min_length: int, suppress_bad_endings: bool, vocab_size: int, device: torch.device
    ) -> EndingRule | None:
        """The rule for these options, or None when neither constraint is on (decoding is then
        exactly what it was without them)."""
        if min_length <= 0 and not suppress_bad_endings:
            return None
        bad_after = banned_mask(special.bad_endings, vocab_size, device) if suppress_bad_endings else None  # (V,)
        return cls(banned_mask((special.eos,), vocab_size, device), min_length, bad_after)

    def apply(self, logprobs: torch.Tensor, prev: torch.Tensor, words: int) -> torch.Tensor:
        """logprobs (R, V) of the step after `words` words, the last of them prev (R,) (<bos>
        at the first step) -> the same with <eos> at -inf where it may not come yet."""
        if words < self.min_length:
            return logprobs.masked_fill(self.eos_column, float("-inf"))  # (R, V)
        if self.bad_after is None:
            return logprobs
        after_bad = self.bad_after.index_select(0, prev)  # (R,) bool: gathered on the device
        return logprobs.masked_fill(after_bad[:, None] & self.eos_column, float("-inf"))  # (R, V)


def apply_ending_rule(rule: EndingRule | None, logprobs: torch.Tensor, prev: torch.Tensor, words: int) -> torch.Tensor:
    """`rule.apply`, or logprobs (R, V) unchanged without a rule."""
    return logprobs if rule is None else rule.apply(logprobs, prev, words)


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


SHRINK_SHARE = 8  # drop ended rows once they are an eighth of the rows still stepping (each drop copies the memory)


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
    over all B*K beams; then group g ranks its K/G*V continuations by log-probability minus
    `diversity_strength` times the number of earlier groups' beams that chose the same word at this step (the Hamming diversity term),
    and keeps its top 2K/G: those ending in <eos> that rank within the top K/G become finished
    hypotheses, the best K/G others stay live. Scores themselves stay log-probabilities: the
    penalty steers the choice, never the ranking of finished captions. A group is done once it
    has K/G finished hypotheses that no live beam of it can still beat. At `max_length` the live
    beams of groups not done compete with the finished hypotheses on the same length-penalised
    score, so a cut-off beam that is clearly better than every ended one wins (finished=False).
    With `self_attention`, the self-attention weights of every step are kept like the
    cross-attention maps, and come back with each hypothesis.

    The host does the bookkeeping (hypotheses are host objects) from one read of the device per
    step: which beams end and with what score, where each live beam came from and its word. The
    attention maps stay on the device, one (B*K, ...) tensor per step; after the search the
    returned hypotheses' rows are found by following the back-pointers and copied in one go.
    On the CPU the images whose searches are all done stop being stepped (once they are an eighth
    of those still stepped): the batch's search then costs about what its images' searches cost
    alone, not its longest search's steps times every beam, and finds the same hypotheses.
    """
    B, K, G, device = feats.shape[0], options.beam_size, options.diverse_groups, feats.device
    max_length, alpha, n_best = options.max_length, options.length_penalty, options.n_best
    bos_id, eos_id, self_attention = special.bos, special.eos, options.self_attention
    if G < 1 or K % G:
        raise ValueError(f"beam size {K} must be a positive multiple of the number of groups {G}")
    if not 1 <= n_best <= K:
        raise ValueError(f"n_best must be between 1 and the beam size {K}; got {n_best}")
    if decoder.vocab_size >= 2**24:  # the step's read carries word ids in float32
        raise ValueError(f"beam search handles vocabularies under 2**24 words; this one has {decoder.vocab_size}")
    Kg, S = K // G, B * G  # beams per group; searches (image, group), rows s*Kg..s*Kg+Kg-1 of search s = b*G+g
    expand = torch.arange(B, device=device).repeat_interleave(K)  # (B*K,): beams of image b are rows b*K..b*K+K-1
    per_image = decoder.prepare(feats)
    state = decoder.init_state(per_image, capacity=max_length)  # (B, ...) each: one row per image until the first step
    memory = decoder.expand_memory(per_image, K)  # per-image constants: expanded once (if at all), never reordered
    prev = torch.full((B,), bos_id, dtype=torch.long, device=device)  # (B,)
    scores = torch.full((B, G, Kg), float("-inf"), device=device)  # (B, G, Kg)
    scores[:, :, 0] = 0.0  # all beams of a group start identical: expand only the first
    history = torch.empty((B * K, 0), dtype=torch.long, device=device)  # (B*K, t): the words, for trigram blocking
    step_maps: list[torch.Tensor] = []  # per step t: (B*K, L, H, N), the attention of the beams stepped
    step_self: list[torch.Tensor] = []  # per step t: (B*K, L, H, t+1), with self_attention
    parents: list[list[int]] = []  # per step: the row each live beam came from (its back-pointer)
    step_words: list[list[int]] = []  # per step: the word each live beam took
    # Per search: the finished hypotheses as (score, log-probability, row, words): the beam was
    # `row` after its last word, and has `words` words.
    finished: list[list[tuple[float, float, int, int]]] = [[] for _ in range(S)]
    done = [False] * S
    best_possible_penalty = length_penalty(max_length, alpha)
    forbidden = banned_mask(special.banned, decoder.vocab_size, device)  # (V,)
    ending = EndingRule.build(special, options.min_length, options.suppress_bad_endings, decoder.vocab_size, device)
    live: list[float] = []  # (B*K,) the live beams' log-probabilities after the last step
    # On the CPU a step costs in proportion to its rows, so the images whose searches are all done
    # leave the step (their rows come back as dead, -inf, for the bookkeeping); on a GPU a step's
    # time hardly depends on its rows, and every row is stepped to the end.
    shrink = device.type == "cpu"
    alive = list(range(B))  # the images whose beams are stepped
    stepped: torch.Tensor | None = None  # (A,) their rows among the B*K, in order; None: all of them
    place: torch.Tensor | None = None  # (B*K,): each stepped row's place in the state (-1: none); None: its own row

    for t in range(max_length):
        step_prev = prev if stepped is None else prev.index_select(0, stepped)  # (A,)
        logprobs, attn, state, self_w = step_decoder(decoder, memory if t else per_image, step_prev, state, self_attention)
        if t == 0:  # the K beams of an image are one hypothesis until now: stepped once per image, then copied to each
            logprobs, attn, prev = logprobs.index_select(0, expand), attn.index_select(0, expand), prev.index_select(0, expand)
            state = select_rows(state, expand)  # (B*K, ...) each
            self_w = None if self_w is None else self_w.index_select(0, expand)
        elif stepped is not None:  # back to all B*K rows, the done images' dead
            logprobs = spread_rows(logprobs, stepped, B * K, float("-inf"))  # (B*K, V)
            attn = spread_rows(attn, stepped, B * K, 0.0)  # (B*K, L, H, N)
            self_w = None if self_w is None else spread_rows(self_w, stepped, B * K, 0.0)  # (B*K, L, H, t+1)
        # logprobs (B*K, V), attn (B*K, L, H, N)
        # In place on the step's own fresh (B*K, V) output: each copy of it is a new 4 MB buffer per step.
        logprobs = apply_ending_rule(ending, logprobs.float().masked_fill_(forbidden, float("-inf")), prev, t)  # (B*K, V)
        if options.block_trigrams:
            logprobs = block_repeated_trigrams(logprobs, history)
        V = logprobs.shape[-1]
        step_maps.append(attn.float())
        if self_w is not None:
            step_self.append(self_w.float())  # (B*K, L, H, t+1)
        candidates = logprobs.add_(scores.view(B * K, 1)).view(B, G, Kg * V)  # (B, G, Kg*V): true log-probabilities
        chosen = torch.zeros(B, V, device=device) if G > 1 else None  # (B, V): how many earlier groups' beams took each word now
        picks = []
        for g in range(G):
            penalised = candidates[:, g] - options.diversity_strength * chosen.repeat(1, Kg) if chosen is not None and g else candidates[:, g]  # (B, Kg*V)
            top_key, top_index = penalised.topk(2 * Kg, dim=1)  # (B, 2Kg)
            top_scores = candidates[:, g].gather(1, top_index)  # (B, 2Kg)
            is_eos = top_index % V == eos_id  # (B, 2Kg)
            live_key, live_pos = top_key.masked_fill(is_eos, float("-inf")).topk(Kg, dim=1)  # (B, Kg) each
            if chosen is not None:  # later groups pay for these words
                chosen.scatter_add_(1, top_index.gather(1, live_pos) % V, (live_key > float("-inf")).float())
            picks.append((top_key, top_index, top_scores, is_eos, live_key, live_pos))
        # One image at a time a step is bound by kernel launches, not arithmetic, so the bookkeeping
        # below launches as few as it can: one group (G = 1, the usual search) is already (S, ...),
        # and a key is either finite or -inf (log-probabilities never reach +inf), so one
        # comparison stands for isfinite's four kernels.
        top_key, top_index, top_scores, is_eos, live_key, live_pos = (
            picks[0] if G == 1 else (torch.stack(x, dim=1).view(S, -1) for x in zip(*picks))
        )  # (S, 2Kg) each, (S, Kg) for the live ones
        top_beam, top_token = top_index // V, top_index % V  # (S, 2Kg) each: beam within the group, word
        ends = is_eos[:, :Kg] & (top_key[:, :Kg] > float("-inf"))  # (S, Kg): <eos> within the top Kg

        # Live beams: the best Kg candidates of each search that do not end here.
        live_beam = top_beam.gather(1, live_pos)  # (S, Kg)
        live_token = top_token.gather(1, live_pos)  # (S, Kg)
        live_scores = top_scores.gather(1, live_pos).masked_fill(live_key == float("-inf"), float("-inf"))  # (S, Kg)
        scores = live_scores.view(B, G, Kg)  # (B, G, Kg): a filler (an <eos> or dead candidate) stays dead
        rows = (torch.arange(S, device=device)[:, None] * Kg + live_beam).view(-1)  # (B*K,): each live beam's parent
        if not shrink:
            state = select_rows(state, rows)  # (B*K, ...) each
        if options.block_trigrams:
            history = torch.cat([history.index_select(0, rows), live_token.view(-1, 1)], dim=1)  # (B*K, t+1)
        prev = live_token.view(-1)

        # The step's one read of the device. cat promotes the flags and ids to the scores' float32
        # itself (no conversion kernels); float32 holds the scores and every id below 2**24 exactly.
        read = torch.cat((ends, top_beam[:, :Kg], top_scores[:, :Kg], live_beam, live_token, live_scores), dim=1).tolist()  # (S, 6Kg)
        for s, r in enumerate(read):  # finished hypotheses: <eos> within the top Kg of a search still going on
            if not done[s]:
                for j in range(Kg):
                    if r[j]:
                        raw = r[2 * Kg + j]
                        finished[s].append((raw / length_penalty(t, alpha), raw, s * Kg + int(r[Kg + j]), t))
        parents.append([s * Kg + int(r[3 * Kg + i]) for s, r in enumerate(read) for i in range(Kg)])
        step_words.append([int(r[4 * Kg + i]) for r in read for i in range(Kg)])
        live = [r[5 * Kg + i] for r in read for i in range(Kg)]
        for s in range(S):
            if not done[s] and len(finished[s]) >= Kg:
                worst = sorted(h[0] for h in finished[s])[-Kg]
                done[s] = worst >= max(live[s * Kg : (s + 1) * Kg]) / best_possible_penalty
        if all(done):
            break
        if not shrink:
            continue
        # On the CPU the state follows each live beam's parent here, and once an eighth of the
        # stepped images are done (the copies of memory and state then pay), only the others' rows are kept.
        still = [b for b in alive if not all(done[b * G : (b + 1) * G])]
        held = place  # where the state holds each row now
        if (len(alive) - len(still)) * SHRINK_SHARE >= len(alive):
            alive = still
            stepped = device_index([b * K + j for b in alive for j in range(K)], device)  # (A,)
            memory = decoder.expand_memory(select_rows(per_image, device_index(alive, device)), K)
            place = torch.full((B * K,), -1, dtype=torch.long, device=device).index_copy_(
                0, stepped, torch.arange(len(stepped), device=device)
            )  # (B*K,)
        sources = rows if stepped is None else rows.index_select(0, stepped)  # (A,): full rows
        state = select_rows(state, sources if held is None else held.index_select(0, sources))  # (A, ...) each

    steps = len(parents)
    live_penalty = length_penalty(steps, alpha)

    def lineage(row: int, words: int) -> list[int]:
        """The rows, after steps 0..words-1, of the beam that is `row` after its last word."""
        rows = [0] * words
        for tau in reversed(range(words)):
            rows[tau] = row
            row = parents[tau][row]
        return rows

    # Per image, the hypotheses returned: (tokens, score, log-probability, ended, lineage).
    chosen: list[list[tuple[list[int], float, float, bool, list[int]]]] = []
    for b in range(B):
        pool = [(*h, True) for s in range(b * G, (b + 1) * G) for h in finished[s]]
        for s in range(b * G, (b + 1) * G):
            if done[s]:
                continue  # its finished hypotheses already beat every live beam
            for row in range(s * Kg, (s + 1) * Kg):  # cut off at max_length: compete on the same score
                if live[row] != float("-inf"):
                    pool.append((live[row] / live_penalty, live[row], row, steps, False))
        ranked, seen = [], set()
        for score, raw, row, words, ended in sorted(pool, key=lambda h: -h[0]):
            if len(ranked) == n_best:
                break
            rows = lineage(row, words)
            tokens = [step_words[tau][r] for tau, r in enumerate(rows)]
            if tuple(tokens) not in seen:  # groups may meet on the same caption: keep it once
                seen.add(tuple(tokens))
                ranked.append((tokens, score, raw, ended, rows))
        chosen.append(ranked)

    # The maps of the returned hypotheses: each word's row of its step's maps, gathered on the
    # device and copied to the host once.
    lineages = [h[4] for ranked in chosen for h in ranked]
    at = device_index([tau * B * K + parents[tau][r] for rows in lineages for tau, r in enumerate(rows)], device)  # (W,)
    sizes = [len(rows) for rows in lineages]
    all_maps = torch.stack(step_maps).flatten(0, 1)  # (steps*B*K, L, H, N)
    maps = iter(all_maps.index_select(0, at).cpu().split(sizes))  # (t, L, H, N) each
    self_maps = None
    if step_self:
        all_self = torch.stack([pad_last(w, steps) for w in step_self]).flatten(0, 1)  # (steps*B*K, L, H, steps)
        self_maps = iter(all_self.index_select(0, at).cpu().split(sizes))  # (t, L, H, steps) each
    results = []
    for ranked in chosen:
        hyps = []
        for tokens, score, raw, ended, rows in ranked:
            words_self = None if self_maps is None else next(self_maps)[..., : len(rows)]  # (t, L, H, t)
            hyps.append(Hypothesis(tokens, score, raw, next(maps), ended, words_self))
        results.append(hyps)
    return results


def spread_rows(x: torch.Tensor, rows: torch.Tensor, total: int, fill: float) -> torch.Tensor:
    """x (A, ...) as rows `rows` (A,) of a (total, ...) tensor whose other rows are `fill`."""
    return x.new_full((total, *x.shape[1:]), fill).index_copy_(0, rows, x)  # (total, ...)


def device_index(index: list[int], device: torch.device) -> torch.Tensor:
    """A host list of row indices as a long tensor on `device`, copied without blocking (pinned
    first on CUDA, as `banned_mask` does)."""
    rows = torch.tensor(index, dtype=torch.long)  # (W,)
    if torch.device(device).type == "cuda":
        rows = rows.pin_memory()
    return rows.to(device, non_blocking=True)
