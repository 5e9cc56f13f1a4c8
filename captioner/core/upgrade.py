"""Formats written before: what an older file says, in today's layout. Each reader of stored
models and runs passes what it read through here first, so no other module knows an old layout."""

from __future__ import annotations

from typing import Any

# Every checkpoint written before `model.encoder.normalization` existed normalised its images
# with ImageNet's statistics, whatever its backbone (captioner.models.backbones.NORMALIZATIONS).
LEGACY_NORMALIZATION = "imagenet"
# The one flat `model.decoder` section of before held every decoder's keys; these are the
# LSTM's and the transformer's own, by which such a section is known.
FLAT_DECODER = {"lstm": ("embed_dim", "dropout", "hidden_dim", "attention_dim"),
                "transformer": ("d_model", "num_layers", "num_heads", "ff_dim", "dropout", "norm_first",
                                "tie_embeddings", "grid_position_encoding")}


def upgrade_run_config(raw: Any) -> Any:
    """A stored run config (or its model sections) in today's layout: an encoder section without
    `normalization` gets the statistics it was trained with; a flat decoder section keeps only
    the keys of its type."""
    model = raw.get("model") if isinstance(raw, dict) else None
    if not isinstance(model, dict):
        return raw
    model = dict(model)
    encoder = model.get("encoder")
    if isinstance(encoder, dict) and "normalization" not in encoder:
        model["encoder"] = {**encoder, "normalization": LEGACY_NORMALIZATION}
    if "decoder" in model:
        model["decoder"] = upgrade_decoder_section(model["decoder"])
    return {**raw, "model": model}


def upgrade_decoder_section(decoder: Any) -> Any:
    """A decoder section as written before each decoder had its own keys (it holds both decoders'
    keys at once): the keys of its type alone. Any other section is returned as it is."""
    if not isinstance(decoder, dict):
        return decoder
    flat = {"hidden_dim", "attention_dim", "d_model", "num_layers", "num_heads", "ff_dim"}
    kind = decoder.get("type", "lstm")
    if not isinstance(kind, str) or kind not in FLAT_DECODER or not flat <= decoder.keys():
        return decoder
    kept = {"type": kind, **{key: decoder[key] for key in FLAT_DECODER[kind] if key in decoder}}
    return {**kept, "activation": "relu"} if kind == "transformer" else kept  # the only one it had
