"""Decoding by role: `options` (DecodeOptions), `rules` (what every mode applies to a step),
two loops, `sampling.roll_out` (word by word: greedy decoding, sampling, SCST's roll-outs) and
the beam search (its state in `beam`), `search` (the inference's entry points over both) and
`stepping` (what the loops share).

The inference API documented in docs/library.md is importable from the package itself.
"""

from captioner.models.decoding.options import DecodeOptions
from captioner.models.decoding.rules import SpecialTokens
from captioner.models.decoding.search import (
    beam_search, beam_search_n_best, decode_hypotheses, greedy_decode, sample_n_best,
)
from captioner.models.decoding.stepping import Hypothesis

__all__ = [
    "DecodeOptions", "Hypothesis", "SpecialTokens", "beam_search", "beam_search_n_best", "decode_hypotheses",
    "greedy_decode", "sample_n_best",
]
