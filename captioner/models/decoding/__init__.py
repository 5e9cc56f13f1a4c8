"""Decoding: greedy decoding, sampling and beam search through the decoder interface: `rules` (what the
loops share), the loops `sampling.roll_out` and `beam`, and `search` (the entry points, docs/library.md)."""

from captioner.core.decode_results import Hypothesis
from captioner.models.decoding.rules import DecodeOptions, SpecialTokens
from captioner.models.decoding.search import (
    beam_search, beam_search_n_best, decode_hypotheses, greedy_decode, sample_n_best,
)

__all__ = [
    "DecodeOptions", "Hypothesis", "SpecialTokens", "beam_search", "beam_search_n_best", "decode_hypotheses",
    "greedy_decode", "sample_n_best",
]
