"""Decoding: greedy decoding, sampling and beam search through the decoder interface.

`options`, `rules` (applied at every step), the loops `sampling.roll_out` and `beam`, `search` (the
entry points) and `stepping` (what the loops share). docs/library.md's inference API imports from here.
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
