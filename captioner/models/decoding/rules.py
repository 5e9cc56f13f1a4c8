"""The rules every decoding mode applies to a step's log-probabilities: banned ids, when `<eos>` may
come, trigram blocking and GNMT's length penalty. deploy/numpy_search.py implements them again
(tests/test_search_conformance.py holds the two together).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from captioner.text.endings import bad_ending_ids

if TYPE_CHECKING:
    from captioner.text.vocab import Vocabulary


@dataclass(frozen=True)
class SpecialTokens:
    """The ids decoding treats apart: `bos`, `eos`, the `banned` ids never produced (not words, so no
    attention map of their own) and the `bad_endings` a caption must not end on."""

    bos: int
    eos: int
    banned: tuple[int, ...] = ()
    bad_endings: tuple[int, ...] = ()

    @classmethod
    def of(cls, vocab: Vocabulary) -> SpecialTokens:
        """A vocabulary's, with <pad>, <bos>, <unk> banned."""
        return cls(
            vocab.bos_id, vocab.eos_id, (vocab.pad_id, vocab.bos_id, vocab.unk_id), bad_ending_ids(vocab.index)
        )


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's ((5 + length) / 6) ** alpha; alpha = 0 ranks by total log-probability."""
    return ((5.0 + length) / 6.0) ** alpha


def block_repeated_trigrams(logprobs: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
    """logprobs (R, V) with -inf at each word w that would repeat a trigram (a, b, w) of history (R, t)."""
    t = history.shape[1]
    if t < 3:
        return logprobs
    last = history[:, -2:]  # (R, 2)
    match = (history[:, :-2] == last[:, :1]) & (history[:, 1:-1] == last[:, 1:])  # (R, t-2): (a, b) at i, i+1
    blocked = torch.zeros_like(logprobs, dtype=torch.float).scatter_add_(
        1, history[:, 2:], match.float()
    )  # (R, V)
    return logprobs.masked_fill(blocked > 0, float("-inf"))


def banned_mask(banned: tuple[int, ...], vocab_size: int, device: torch.device) -> torch.Tensor:
    """(V,) bool, true at `banned`: built once per decode on the host and copied without blocking, so
    no step indexes a device tensor with a host list."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)  # (V,), made on the host
    mask[list(banned)] = True
    if torch.device(device).type == "cuda":  # pinned, so the copy does not wait for the GPU
        mask = mask.pin_memory()
    return mask.to(device, non_blocking=True)  # (V,)


@dataclass(frozen=True)
class EndingRule:
    """When <eos> may be chosen: not before `min_length` words, nor right after a word `bad_after`
    (V,) marks ("a", "with", ...). A step reads nothing back from the device."""

    eos_column: torch.Tensor  # (V,) bool, true at <eos> only
    min_length: int = 0
    bad_after: torch.Tensor | None = None  # (V,) bool: no <eos> right after these words

    @classmethod
    def build(
        cls,
        special: SpecialTokens,
        min_length: int,
        suppress_bad_endings: bool,
        vocab_size: int,
        device: torch.device,
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


def apply_ending_rule(
    rule: EndingRule | None, logprobs: torch.Tensor, prev: torch.Tensor, words: int
) -> torch.Tensor:
    """`rule.apply`, or logprobs (R, V) unchanged without a rule."""
    return logprobs if rule is None else rule.apply(logprobs, prev, words)
