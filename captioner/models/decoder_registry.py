"""The decoder registry: each decoder's name, the config class of the keys it reads
(core.decoder_configs.DECODER_CONFIGS) and the function that builds it from one.

A model's whole description is `core.model_spec.ModelSpec` (plain data, so the ONNX runtime
reads it too); its decoder part is one of these config classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from captioner.core.decoder_configs import DECODER_CONFIGS, LSTMDecoderConfig, TransformerDecoderConfig
from captioner.models.decoder import Decoder

__all__ = ["DECODERS", "DecoderEntry", "build_decoder"]


def build_lstm(config: LSTMDecoderConfig, vocab_size: int, feat_dim: int) -> Decoder:
    from captioner.models.lstm_decoder import LSTMDecoder

    return LSTMDecoder(vocab_size, feat_dim, config.embed_dim, config.hidden_dim, config.attention_dim, config.dropout)


def build_transformer(config: TransformerDecoderConfig, vocab_size: int, feat_dim: int) -> Decoder:
    from captioner.models.transformer_decoder import TransformerDecoder

    return TransformerDecoder(
        vocab_size, feat_dim, d_model=config.d_model, num_layers=config.num_layers, num_heads=config.num_heads,
        ff_dim=config.ff_dim, dropout=config.dropout, norm_first=config.norm_first,
        tie_embeddings=config.tie_embeddings, grid_position_encoding=config.grid_position_encoding,
    )


@dataclass(frozen=True)
class DecoderEntry:
    """A registered decoder: the config class of the keys it reads, and what builds it from one."""

    config: type
    build: Callable[..., Decoder]  # (config, vocab_size, feat_dim) -> Decoder


# `model.decoder.type` -> its entry; a new decoder adds its config class to core.decoder_configs.DECODER_CONFIGS and its builder here.
DECODERS: dict[str, DecoderEntry] = {
    "lstm": DecoderEntry(LSTMDecoderConfig, build_lstm),
    "transformer": DecoderEntry(TransformerDecoderConfig, build_transformer),
}
assert {name: entry.config for name, entry in DECODERS.items()} == DECODER_CONFIGS, "every decoder config has its builder"


def build_decoder(config: LSTMDecoderConfig | TransformerDecoderConfig, vocab_size: int, feat_dim: int) -> Decoder:
    """The decoder `config` (a registered decoder's config class) describes, over features of `feat_dim`."""
    entry = next(entry for entry in DECODERS.values() if isinstance(config, entry.config))
    return entry.build(config, vocab_size, feat_dim)
