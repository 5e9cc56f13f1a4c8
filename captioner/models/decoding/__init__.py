"""Decoding by role: `options` (DecodeOptions), `rules` (what every mode applies to a step),
`search` (greedy decoding, sampling and beam search for inference; the beam's state in `beam`),
`sampling` (SCST's roll-outs with gradients) and `stepping` (what the loops share).

The inference API documented in docs/library.md is importable from the package itself.
"""

from captioner.models.decoding.options import DecodeOptions
from captioner.models.decoding.rules import SpecialTokens
from captioner.models.decoding.search import beam_search, beam_search_n_best, decode_hypotheses, greedy_decode, sample_n_best
from captioner.models.decoding.stepping import Hypothesis

__all__ = ["DecodeOptions", "Hypothesis", "SpecialTokens", "beam_search", "beam_search_n_best", "decode_hypotheses", "greedy_decode", "sample_n_best"]
