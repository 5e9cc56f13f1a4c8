"""`DecodeOptions`: every choice of how to decode, as one frozen value the decoding functions take.

The options are declared once in core/decode_schema.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from captioner.core.config_sections import DecodeConfig
from captioner.core.decode_schema import OPTIONS as DECODE_OPTIONS
from captioner.core.decode_schema import check_names, check_options


def _default(name: str) -> Any:
    return DECODE_OPTIONS[name].default


@dataclass(frozen=True)
class DecodeOptions:
    """Every choice of how to decode, checked where it is made against core/decode_schema.py: a bad
    value is the same one-line ConfigError as in a config, on the command line or in the demo."""

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
        """A model's `decode` section, then the caller's `overrides` (None keeps the section's value)."""
        check_names(overrides)
        configured = {name: getattr(config, name) for name in DECODE_OPTIONS if hasattr(config, name)}
        given = {name: value for name, value in overrides.items() if value is not None}
        return cls(**{**configured, **given})
