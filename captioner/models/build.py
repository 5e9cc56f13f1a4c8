"""Model construction from a config: `build_model(config, vocab) -> Captioner`."""

from __future__ import annotations

from captioner.core.config import Config
from captioner.core.errors import ConfigError
from captioner.models.captioner import Captioner
from captioner.models.decoder import Decoder
from captioner.models.encoders import build_encoder
from captioner.models.lstm_decoder import LSTMDecoder
from captioner.text.vocab import Vocabulary


def build_decoder(config: Config, vocab_size: int, feat_dim: int) -> Decoder:
    d = config.model.decoder
    if d.type == "lstm":
        return LSTMDecoder(vocab_size, feat_dim, d.embed_dim, d.hidden_dim, d.attention_dim, d.dropout)
    if d.type == "transformer":
        from captioner.models.transformer_decoder import TransformerDecoder

        return TransformerDecoder.from_config(d, vocab_size, feat_dim)
    raise ConfigError(f"model.decoder.type: unknown decoder {d.type!r}")


def build_model(config: Config, vocab: Vocabulary, load_pretrained: bool = True) -> Captioner:
    encoder = build_encoder(config.model.encoder, load_pretrained)
    decoder = build_decoder(config, len(vocab), encoder.out_dim)
    return Captioner(encoder, decoder, vocab, config.model, config.data.image_size, config.decode)
