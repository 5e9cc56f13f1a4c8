"""One description of a trained model (`ModelSpec`): encoder, preprocessing, decoder section, vocabulary,
special tokens and decoding defaults. Every model file carries it as one versioned `spec` object. It is
plain torch-free data (the decoder's section stays a mapping), so the ONNX runtime reads it too."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from captioner.core.config import decoder_config, section_from_dict
from captioner.core.config_sections import Config, DataConfig, DecodeConfig, EncoderConfig
from captioner.core.decode_schema import combination_problem, raise_problem
from captioner.core.decoder_types import section
from captioner.core.errors import ConfigError

SPEC_VERSION = 1  # of the `spec` object; bump when a field's meaning changes
# The ONNX bundle's manifest: written by captioner.models.onnx_export, read by captioner.deploy.runtime.
ONNX_FORMAT = "captioner-onnx"
ONNX_FORMAT_VERSION = 2  # 2: the model is described by its `spec`; 1 (still read) spread it over top-level fields
SPECIAL_WORDS = ("pad", "bos", "eos", "unk")  # the vocabulary's first four entries, in this order
RESIZE = "Pillow bilinear to image_size x image_size, then uint8 RGB"
NORMALIZE = "x / 255, then (x - mean) / std per channel"


@dataclass(frozen=True)
class Preprocessing:
    """An image resized to a square of `image_size`, then normalised with `mean` and `std` inside the
    encoder; the statistics are None where a file did not record them (`normalization` names them)."""

    image_size: int
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None


@dataclass(frozen=True)
class SpecialIds:
    """The ids of <pad>, <bos>, <eos> and <unk>; decoding never writes `banned` (pad, bos, unk)."""

    pad: int
    bos: int
    eos: int
    unk: int

    @property
    def banned(self) -> tuple[int, ...]:
        return (self.pad, self.bos, self.unk)


@dataclass(frozen=True)
class ModelSpec:
    """Everything that rebuilds a model besides its weights, and that its runtime needs."""

    encoder: EncoderConfig
    preprocessing: Preprocessing
    # the `model.decoder` section: its type and keys (`decoder_config()` checks and builds them)
    decoder: dict[str, Any]
    vocab: tuple[str, ...]
    special: SpecialIds
    decode: DecodeConfig
    blind: bool = False  # the features are zeroed: a language-model baseline
    grid: tuple[int, int] | None = None  # (h, w) of the encoder's feature grid at image_size, when recorded
    feature_dim: int | None = None  # D of the encoder's features, when recorded

    @property
    def decoder_type(self) -> str:
        return self.decoder["type"]

    def decoder_config(self, source: str = "spec") -> Any:
        """The decoder's section as its registered config dataclass, checked."""
        return decoder_config(self.decoder, source)

    @classmethod
    def of(cls, config: Config, vocab: tuple[str, ...], mean: Any = None, std: Any = None, grid: Any = None,
           feature_dim: int | None = None) -> ModelSpec:
        """The spec of the model `config` describes, with the vocabulary's words."""
        return cls(encoder=config.model.encoder, preprocessing=Preprocessing(config.data.image_size, mean, std),
                   decoder=section(config.model.decoder), vocab=vocab, special=SpecialIds(*range(len(SPECIAL_WORDS))),
                   decode=config.decode, blind=config.model.blind, grid=grid, feature_dim=feature_dim)

    def to_dict(self, with_vocab: bool = True) -> dict[str, Any]:
        """The JSON form every model file carries; `with_vocab=False` gives `vocab_size` in place
        of the words (an export keeps them in vocab.json)."""
        words: dict[str, Any] = {"vocab": list(self.vocab)} if with_vocab else {"vocab_size": len(self.vocab)}
        pre = self.preprocessing
        return {
            "spec_version": SPEC_VERSION, "encoder": dataclasses.asdict(self.encoder),
            "preprocessing": {"image_size": pre.image_size, "resize": RESIZE, "normalize": NORMALIZE,
                              "mean": _list(pre.mean), "std": _list(pre.std)},
            "grid": _list(self.grid), "feature_dim": self.feature_dim, "decoder": dict(self.decoder),
            "blind": self.blind, **words, "special_tokens": dataclasses.asdict(self.special),
            "decode": dataclasses.asdict(self.decode),
        }

    @classmethod
    def from_dict(cls, raw: Any, source: str, vocab: list[str] | None = None, check_decoder: bool = True) -> ModelSpec:
        """A `spec` object read back, checked like a config file: one ConfigError naming `source` when a
        field is missing, unknown or out of range. `vocab`: the words, for a spec written without them.
        `check_decoder=False` keeps the decoder's section unread (the ONNX runtime: its graphs hold it)."""
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: spec must be a mapping, got {type(raw).__name__}")
        if raw.get("spec_version") != SPEC_VERSION:
            raise ConfigError(f"{source}: spec_version {raw.get('spec_version')!r} is not supported (this version "
                              f"reads {SPEC_VERSION})")
        missing = [key for key in ("encoder", "preprocessing", "decoder", "special_tokens", "decode")
                   if not isinstance(raw.get(key), dict)]
        if missing:
            raise ConfigError(f"{source}: spec lacks {', '.join(missing)} (or one is not a mapping)")
        words = check_words(raw.get("vocab", vocab), source)
        if "vocab_size" in raw and raw["vocab_size"] != len(words):
            raise ConfigError(
                f"{source}: spec says vocab_size {raw['vocab_size']!r}, the vocabulary has {len(words)} words")
        ids = SpecialIds(*range(len(SPECIAL_WORDS)))  # the vocabulary's first four words
        if raw["special_tokens"] != dataclasses.asdict(ids):
            raise ConfigError(f"{source}: special_tokens {raw['special_tokens']!r} are not the vocabulary's "
                              f"({dataclasses.asdict(ids)})")
        decoder = raw["decoder"]
        if check_decoder:
            decoder = section(decoder_config(decoder, source))
        elif not isinstance(decoder.get("type"), str):
            raise ConfigError(f"{source}: 'model.decoder' must be a mapping with a type, got {decoder!r}")
        decode_config = section_from_dict(DecodeConfig, raw["decode"], "decode.", source)
        raise_problem(combination_problem(dataclasses.asdict(decode_config)), f"{source}: decode")
        pre, blind = raw["preprocessing"], raw.get("blind", False)
        size = section_from_dict(DataConfig, {"image_size": pre.get("image_size")}, "data.", source).image_size
        if not isinstance(blind, bool):
            raise ConfigError(f"{source}: 'model.blind' must be bool; got {blind!r}")
        return cls(encoder=section_from_dict(EncoderConfig, raw["encoder"], "model.encoder.", source),
                   preprocessing=Preprocessing(size, floats(pre.get("mean"), "mean", source),
                                               floats(pre.get("std"), "std", source)),
                   decoder=dict(decoder), vocab=words, special=ids, decode=decode_config, blind=blind,
                   grid=grid_of(raw.get("grid"), source),
                   feature_dim=positive_int(raw.get("feature_dim"), "feature_dim", source))


def check_words(vocab: Any, source: str) -> tuple[str, ...]:
    """The vocabulary's words: strings, starting with <pad>, <bos>, <eos>, <unk>."""
    if not isinstance(vocab, (list, tuple)) or not all(isinstance(word, str) for word in vocab):
        raise ConfigError(f"{source}: vocab must be a list of words")
    if tuple(vocab[: len(SPECIAL_WORDS)]) != tuple(f"<{word}>" for word in SPECIAL_WORDS):
        raise ConfigError(f"{source}: vocab must start with {', '.join(f'<{word}>' for word in SPECIAL_WORDS)}")
    seen: set[str] = set()
    for i, word in enumerate(vocab):  # a caption is printed one a line: a model's word must not end a line or
        if not word.isprintable() or word.split() != [word]:  # steer the terminal (the tokenizer makes none such)
            raise ConfigError(f"{source}: vocab word {i} {word[:40]!r} is empty or holds a space or a control "
                              "character; refused")
        if word in seen:  # two ids of one word: its id would not be the one the weights learnt
            raise ConfigError(f"{source}: vocab holds the word {word[:40]!r} twice")
        seen.add(word)
    return tuple(vocab)


def floats(value: Any, name: str, source: str) -> tuple[float, ...] | None:
    """preprocessing.mean or .std: one finite number per RGB channel, a std above 0 (it divides), or None."""
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 3
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in value)):
        raise ConfigError(f"{source}: preprocessing.{name} must be 3 finite numbers (R, G, B), got {value!r}")
    if name == "std" and min(value) <= 0:
        raise ConfigError(f"{source}: preprocessing.std must be above 0 (it divides), got {value!r}")
    return tuple(float(x) for x in value)


def grid_of(value: Any, source: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value)):
        raise ConfigError(f"{source}: grid must be [h, w], got {value!r}")
    return (value[0], value[1])


def positive_int(value: Any, name: str, source: str) -> int | None:
    if value is None:
        return None
    if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        raise ConfigError(f"{source}: {name} must be a positive integer, got {value!r}")
    return value


def _list(values: tuple | None) -> list | None:
    return None if values is None else list(values)
