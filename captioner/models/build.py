"""Model construction from a config: `build_model(config, vocab) -> Captioner`.

The construction itself is `Captioner.from_config` (loading a checkpoint builds the same way);
this is the name training, the feature store and the benchmarks build models by.
"""

from __future__ import annotations

from captioner.core.config import Config
from captioner.models.captioner import Captioner
from captioner.models.decoders import build_decoder
from captioner.text.vocab import Vocabulary

__all__ = ["build_decoder", "build_model"]


def build_model(config: Config, vocab: Vocabulary, load_pretrained: bool = True) -> Captioner:
    """A fresh model as `config` describes it; `load_pretrained=False` skips the backbone's
    ImageNet weights (a checkpoint brings its own)."""
    return Captioner.from_config(config, vocab, load_pretrained)
