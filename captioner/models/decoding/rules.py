"""The rules every decoding mode applies to a step's log-probabilities: the special ids, the banned
ids, when `<eos>` may come (`EndingRule`), trigram blocking and GNMT's length penalty.

Greedy decoding, sampling, beam search and the SCST roll-out all apply these, so a rule means
the same in every mode; the numpy search (deploy/numpy_search.py) implements the same rules again
for numpy, and tests/test_search_conformance.py holds the two together.
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


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's ((5 + length) / 6) ** alpha; alpha = 0 ranks by total log-probability."""
    return ((5.0 + length) / 6.0) ** alpha


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
    there; the schema keeps min_length <= max_length."""

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
