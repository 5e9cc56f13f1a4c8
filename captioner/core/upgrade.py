"""Formats written before, in today's layout: every reader of stored models and runs passes what it
read through here first, so no other module knows an old layout."""

from __future__ import annotations

from typing import Any

from captioner.core.config_sections import DataConfig
from captioner.core.errors import ConfigError, ExportError

# Every checkpoint written before `model.encoder.normalization` existed normalised its images
# with ImageNet's statistics, whatever its backbone (captioner.models.encoders.NORMALIZATIONS).
LEGACY_NORMALIZATION = "imagenet"
# The one flat `model.decoder` section of before held every decoder's keys; these are the
# LSTM's and the transformer's own, by which such a section is known.
FLAT_DECODER = {"lstm": ("embed_dim", "dropout", "hidden_dim", "attention_dim"),
                "transformer": ("d_model", "num_layers", "num_heads", "ff_dim", "dropout", "norm_first",
                                "tie_embeddings", "grid_position_encoding")}


def upgrade_run_config(raw: Any) -> Any:
    """A stored run config in today's layout: an encoder section gets the `normalization` it was
    trained with; a flat decoder section keeps only the keys of its type."""
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
    """A flat decoder section (both decoders' keys at once) as the keys of its type alone; others as they are."""
    if not isinstance(decoder, dict):
        return decoder
    flat = {"hidden_dim", "attention_dim", "d_model", "num_layers", "num_heads", "ff_dim"}
    kind = decoder.get("type", "lstm")
    if not isinstance(kind, str) or kind not in FLAT_DECODER or not flat <= decoder.keys():
        return decoder
    kept = {"type": kind, **{key: decoder[key] for key in FLAT_DECODER[kind] if key in decoder}}
    return {**kept, "activation": "relu"} if kind == "transformer" else kept  # the only one it had


# Keys whose values were once booleans: what each old value means now, so that configs and
# checkpoints written then load as they trained (YAML also reads on/off and yes/no as booleans).
LEGACY_VALUES: dict[str, dict[Any, Any]] = {"train.cpu_amp": {False: "fp32", True: "auto"}}
OLDEST_EXPORT = OLDEST_ONNX = 1  # the oldest format versions of exports and ONNX bundles still read


def upgrade_value(dotted: str, value: Any) -> Any:
    """A config value as this version names it (an old boolean of `LEGACY_VALUES`)."""
    return LEGACY_VALUES[dotted][value] if isinstance(value, bool) and dotted in LEGACY_VALUES else value


def spec_of_sections(stored: Any, source: str, **parts: Any) -> dict[str, Any]:
    """The `spec` of a model filed before the spec, from its run config (only the model, data.image_size
    and decode sections: a training setting no longer accepted does not stop it loading). `parts`: vocab
    or vocab_size, and special_tokens, mean, std, grid, feature_dim where the file recorded them."""
    if not isinstance(stored, dict):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(stored).__name__}")
    stored = upgrade_run_config(stored)
    model, data = stored.get("model", {}), stored.get("data", {})
    for name, section in (("model", model), ("data", data)):
        if not isinstance(section, dict):
            raise ConfigError(f"{source}: {name!r} must be a mapping, got {section!r}")
    words = {"vocab": parts["vocab"]} if "vocab" in parts else {"vocab_size": parts.get("vocab_size")}
    return {
        "spec_version": 1, "encoder": model.get("encoder", {}),
        "preprocessing": {"image_size": data.get("image_size", DataConfig.image_size), "mean": parts.get("mean"),
                          "std": parts.get("std")},
        "grid": parts.get("grid"), "feature_dim": parts.get("feature_dim"),
        "decoder": model.get("decoder", {"type": "lstm"}), "blind": model.get("blind", False), **words,
        "special_tokens": parts.get("special_tokens") or dict(zip(("pad", "bos", "eos", "unk"), range(4))),
        "decode": stored.get("decode", {}),
    }


def checkpoint_spec(payload: dict[str, Any], source: str) -> tuple[Any, str]:
    """A checkpoint's `spec` and where it came from: its own, or one made from its config and vocabulary."""
    if "spec" in payload:
        return payload["spec"], f"{source} (spec)"
    return spec_of_sections(payload["config"], f"{source} (config)", vocab=payload["vocab"]), f"{source} (config)"


def upgrade_export_config(config: dict[str, Any], source: str) -> dict[str, Any]:
    """An export's config.json of format 1 (config sections beside vocab_size, special_tokens,
    preprocessing and encoder) as format 2, which holds the model's `spec`."""
    if config.get("format_version") != 1:
        return config
    for key in ("model", "data", "decode", "vocab_size"):
        if key not in config:
            raise ExportError(f"{source}: lacks {key!r}")
    preprocessing, encoder = config.get("preprocessing") or {}, config.get("encoder") or {}
    spec = spec_of_sections(config, f"{source} (config)", vocab_size=config["vocab_size"],
                            special_tokens=config.get("special_tokens"), mean=preprocessing.get("mean"),
                            std=preprocessing.get("std"), grid=encoder.get("grid"),
                            feature_dim=encoder.get("feature_dim"))
    return {**config, "format_version": 2, "spec": spec}


def upgrade_onnx_manifest(manifest: dict[str, Any], source: str) -> dict[str, Any]:
    """An ONNX bundle's onnx.json of format 1 (the model's fields at the top level) as format 2,
    which holds the model's `spec`. Format 1 named the encoder and the decoder's type alone."""
    if manifest.get("format_version") != 1:
        return manifest
    fields = {"vocab": list, "special_tokens": dict, "image_size": int, "grid": list, "decoder": dict, "decode": dict}
    for field, kind in fields.items():
        if not isinstance(manifest.get(field), kind) or isinstance(manifest.get(field), bool):
            raise ExportError(f"{source}: field {field!r} is missing or malformed")
    special = manifest["special_tokens"]  # the grid's shape is the spec's to check (`ModelSpec.from_dict`)
    if not (isinstance(special.get("bos"), int) and isinstance(special.get("eos"), int)
            and isinstance(special.get("banned"), list)):
        raise ExportError(f"{source}: special_tokens must give bos, eos and banned ids")
    ids = [special["bos"], special["eos"], *special["banned"]]
    if ids != [1, 2, 0, 1, 3]:  # the vocabulary's <bos>, <eos>, and <pad>, <bos>, <unk>
        raise ExportError(f"{source}: special_tokens {ids} are not its vocab's <bos>, <eos> and <pad>, <bos>, <unk>")
    decoder = manifest["decoder"].get("type")
    spec = spec_of_sections({"model": {"encoder": {"name": manifest["encoder"]}, "decoder": {"type": decoder}},
                             "data": {"image_size": manifest["image_size"]}, "decode": manifest["decode"]},
                            f"{source} (spec)", vocab=manifest["vocab"], grid=manifest["grid"])
    return {**manifest, "format_version": 2, "spec": spec}
