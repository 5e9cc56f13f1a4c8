"""Decoding: greedy decoding, sampling and beam search through the decoder interface: `rules` (what the
loops share), the loops `sampling.roll_out` and `beam`, and here `decode_hypotheses`, the entry point that
takes decoder, feats (B, N, D), `SpecialTokens`, `DecodeOptions` -> per image hypotheses (docs/library.md)."""

from __future__ import annotations

import torch

from captioner.core.decode_results import Hypothesis
from captioner.models.decoder import Decoder
from captioner.models.decoding.beam import beam_search, beam_search_n_best
from captioner.models.decoding.rules import DecodeOptions, SpecialTokens
from captioner.models.decoding.sampling import greedy_decode, sample_n_best

__all__ = [
    "DecodeOptions", "Hypothesis", "SpecialTokens", "beam_search", "beam_search_n_best", "decode_hypotheses",
    "greedy_decode", "sample_n_best",
]


def decode_hypotheses(
    decoder: Decoder, feats: torch.Tensor, special: SpecialTokens, options: DecodeOptions
) -> list[list[Hypothesis]]:
    """feats (B, N, D) -> per image its `n_best` hypotheses, best first, drawn, searched or greedy."""
    if options.sample:
        return sample_n_best(decoder, feats, special, options)
    if options.beam_size <= 1:
        return [[h] for h in greedy_decode(decoder, feats, special, options)]
    return beam_search_n_best(decoder, feats, special, options)
