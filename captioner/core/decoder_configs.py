"""Each decoder's own config: the keys of the flat `model.decoder` section (core.config_sections'
`DecoderConfig`, what users write) that the decoder of that type reads, as one frozen class per
decoder, by name. A model spec holds one of these; models/decoder_registry.py builds from it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LSTMDecoderConfig:
    """What the `lstm` decoder reads of `model.decoder` (Show, Attend and Tell)."""

    embed_dim: int
    hidden_dim: int
    attention_dim: int
    dropout: float


@dataclass(frozen=True)
class TransformerDecoderConfig:
    """What the `transformer` decoder reads of `model.decoder` (its words embed at d_model)."""

    d_model: int
    num_layers: int
    num_heads: int
    ff_dim: int
    dropout: float
    norm_first: bool
    tie_embeddings: bool
    grid_position_encoding: bool


DecoderSettings = LSTMDecoderConfig | TransformerDecoderConfig
# The decoders by name, each with the config class of the keys it reads; models/decoder_registry.py
# adds the builder of each (core may not import torch).
DECODER_CONFIGS: dict[str, type[LSTMDecoderConfig] | type[TransformerDecoderConfig]] = {
    "lstm": LSTMDecoderConfig,
    "transformer": TransformerDecoderConfig,
}
