"""The decoders behind one interface (`Decoder`): which class and arguments `model.decoder` names."""

from __future__ import annotations

from captioner.core.config import Config
from captioner.core.errors import ConfigError
from captioner.models.decoder import Decoder
from captioner.models.lstm_decoder import LSTMDecoder


def build_decoder(config: Config, vocab_size: int, feat_dim: int) -> Decoder:
    """The decoder `model.decoder` describes, over features of `feat_dim`."""
    d = config.model.decoder
    if d.type == "lstm":
        return LSTMDecoder(vocab_size, feat_dim, d.embed_dim, d.hidden_dim, d.attention_dim, d.dropout)
    if d.type == "transformer":
        from captioner.models.transformer_decoder import TransformerDecoder

        return TransformerDecoder.from_config(d, vocab_size, feat_dim)
    raise ConfigError(f"model.decoder.type: unknown decoder {d.type!r}")
