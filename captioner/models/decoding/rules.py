"""What the decoding loops share: their `DecodeOptions`, the rules applied to a step's log-probabilities
(banned ids, when `<eos>` may come, trigram blocking), one decoder step and the rows of a shrinking
batch; their `Hypothesis` and length penalty are core/decode_results.py's. deploy/numpy_search.py
implements the rules again (tests/test_search_conformance.py holds the two together)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from captioner.core.config_sections import DecodeConfig
from captioner.core.decode_schema import OPTIONS as DECODE_OPTIONS, check_names, check_options
from captioner.models.decoder import Decoder, to_device_quietly
from captioner.text.vocab import Vocabulary, bad_ending_ids

SHRINK_SHARE = 8  # drop ended rows once they are an eighth of those stepping (each drop copies the memory)


def _default(name: str) -> Any:
    return DECODE_OPTIONS[name].default


@dataclass(frozen=True)
class DecodeOptions:
    """Every choice of how to decode, checked where it is made against core/decode_schema.py."""

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
        checked = check_options({f.name: getattr(self, f.name) for f in fields(self)})
        for name, value in checked.items():  # 3.0 -> 3: a whole number given as a float is kept as an int
            object.__setattr__(self, name, value)

    @classmethod
    def from_config(cls, config: DecodeConfig, **overrides: Any) -> DecodeOptions:
        """A model's `decode` section, then the caller's `overrides` (None keeps the section's value)."""
        check_names(overrides)
        configured = {name: getattr(config, name) for name in DECODE_OPTIONS if hasattr(config, name)}
        given = {name: value for name, value in overrides.items() if value is not None}
        return cls(**{**configured, **given})


def step_decoder(
    decoder: Decoder, memory: dict[str, torch.Tensor], prev: torch.Tensor, state: dict[str, torch.Tensor],
    self_attention: bool,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
    """One decoder step, and with `self_attention` its self-attention weights (R, L, H, t+1) or None."""
    if not (self_attention and decoder.has_self_attention):
        return (*decoder.step(memory, prev, state), None)
    logprobs, attn, state = decoder.step(memory, prev, state, self_attention=True)  # type: ignore[call-arg]
    state = dict(state)
    return logprobs, attn, state, state.pop("self_attn")


def pad_last(x: torch.Tensor, size: int) -> torch.Tensor:
    """Zero-pad the last dimension of x to `size`."""
    return torch.nn.functional.pad(x, (0, size - x.shape[-1]))


def spread_rows(x: torch.Tensor, rows: torch.Tensor, total: int, fill: float) -> torch.Tensor:
    """x (A, ...) as rows `rows` (A,) of a (total, ...) tensor whose other rows are `fill`."""
    return x.new_full((total, *x.shape[1:]), fill).index_copy_(0, rows, x)  # (total, ...)


def device_index(index: list[int], device: torch.device) -> torch.Tensor:
    """A host list of row indices as a long tensor on `device`, copied without blocking."""
    return to_device_quietly(torch.tensor(index, dtype=torch.long), device)  # (W,)


@dataclass(frozen=True)
class SpecialTokens:
    """The ids decoding treats apart: `bos`, `eos`, `banned` ids never produced, `bad_endings` no caption ends on."""

    bos: int
    eos: int
    banned: tuple[int, ...] = ()
    bad_endings: tuple[int, ...] = ()

    @classmethod
    def of(cls, vocab: Vocabulary) -> SpecialTokens:
        """A vocabulary's, with <pad>, <bos>, <unk> banned."""
        return cls(vocab.bos_id, vocab.eos_id, (vocab.pad_id, vocab.bos_id, vocab.unk_id), bad_ending_ids(vocab.index))


def block_repeated_trigrams(logprobs: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    """logprobs (R, V) with -inf at each word w that would repeat a trigram (a, b, w) of history (R, t)."""
    if history.shape[1] < 3:
        return logprobs
    last = history[:, -2:]  # (R, 2)
    match = (history[:, :-2] == last[:, :1]) & (history[:, 1:-1] == last[:, 1:])  # (R, t-2): (a, b) at i, i+1
    blocked = torch.zeros_like(logprobs, dtype=torch.float).scatter_add_(1, history[:, 2:], match.float())  # (R, V)
    return logprobs.masked_fill(blocked > 0, float("-inf"))


def banned_mask(banned: tuple[int, ...], vocab_size: int, device: torch.device) -> torch.Tensor:
    """(V,) bool, true at `banned`: built on the host once per decode and copied without blocking."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)  # (V,), made on the host
    mask[list(banned)] = True
    return to_device_quietly(mask, device)  # (V,)


@dataclass(frozen=True)
class EndingRule:
    """When <eos> may be chosen: not before `min_length` words, nor right after a `bad_after` word ("a", "with")."""

    eos_column: torch.Tensor  # (V,) bool, true at <eos> only
    min_length: int = 0
    bad_after: torch.Tensor | None = None  # (V,) bool: no <eos> right after these words

    @classmethod
    def build(
        cls, special: SpecialTokens, min_length: int, suppress_bad_endings: bool, vocab_size: int, device: torch.device,
    ) -> EndingRule | None:
        """The rule for these options, or None when neither constraint is on."""
        if min_length <= 0 and not suppress_bad_endings:
            return None
        bad_after = banned_mask(special.bad_endings, vocab_size, device) if suppress_bad_endings else None  # (V,)
        return cls(banned_mask((special.eos,), vocab_size, device), min_length, bad_after)

    def apply(self, logprobs: torch.Tensor, prev: torch.Tensor, words: int) -> torch.Tensor:
        """logprobs (R, V) after `words` words, the last prev (R,) -> <eos> at -inf where not allowed."""
        if words < self.min_length:
            return logprobs.masked_fill(self.eos_column, float("-inf"))  # (R, V)
        if self.bad_after is None:
            return logprobs
        after_bad = self.bad_after.index_select(0, prev)  # (R,) bool: gathered on the device
        return logprobs.masked_fill(after_bad[:, None] & self.eos_column, float("-inf"))  # (R, V)
