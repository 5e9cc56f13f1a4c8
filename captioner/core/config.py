"""Loading a config: the defaults, then a YAML file, then dotted overrides, then the checks that span keys.

An unknown key, a value of the wrong type or outside its spec is one `ConfigError` line naming the file,
the key, the value and what is allowed, so a typo never silently trains the wrong model.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import functools
import math
import types
import typing
from pathlib import Path
from typing import Any

from captioner.core.bounded_files import parse_yaml, read_text_file
from captioner.core.config_sections import SHAPES_MIN_IMAGE_SIZE, Config
from captioner.core.decode_schema import DecodeOption, combination_problem, raise_problem
from captioner.core.decoder_types import decoder_type, registered, type_of
from captioner.core.errors import ConfigError
from captioner.core.specs import Choice
from captioner.core.upgrade import upgrade_run_config, upgrade_value

# What a config file may take: the shipped ones take 1 to 3 KB. Past this it is not a config (a log, a renamed
# image), and PyYAML, at about two seconds a megabyte, would seem to hang on it.
CONFIG_BYTES = 2**20


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then the YAML file, then `section.key=value` overrides, then validation; a rule that ties keys
    together and fails names the command line when the overrides brought the problem."""
    import yaml  # here, not at the top: the torch-free runtime reads model specs without PyYAML
    config = Config()
    source = "defaults" if path is None else str(path)
    if path is not None:
        try:
            raw = parse_yaml(read_text_file(path, "config file", ConfigError, CONFIG_BYTES), str(path), "config file",
                             ConfigError, max_aliases=None, unique_keys=True)
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of sections (data, model, train, scst, decode)")
        _merge(config, raw or {}, "", source)
    before = copy.deepcopy(config) if overrides else None
    _set_overrides(config, overrides)
    error = _problem(config, source)
    if error is not None and before is not None:  # said again, naming the source that brought the problem
        error = _problem(config, _blamed(before, config, source)) or error
    if error is not None:
        raise error
    return config


def _problem(config: Config, source: str) -> ConfigError | None:
    """What `validate` or a new config's rules refuse in `config`, naming `source`; None when it passes."""
    try:
        validate(config, source)
        check_new_config(config, source)
    except ConfigError as e:
        return e
    return None


def _blamed(before: Config, after: Config, source: str) -> str:
    """The source a failed rule that ties keys together names once overrides are set (each key alone was judged
    as it was set): the command line when the config passed without them, the config's own source when it
    failed the same way without them, else the two together."""
    alone = _problem(before, "")
    if alone is None:
        return "command line"
    return source if str(alone) == str(_problem(after, "")) else f"{source} with the command line's overrides"


def apply_overrides(config: Config, overrides: list[str] | tuple[str, ...], source: str = "config",
                    only: str | None = None) -> Config:
    """`section.key=value` overrides set on `config` (in place), then the whole config validated.
    `only` (a prefix such as "data.") refuses any other key in one line."""
    _set_overrides(config, overrides, only)
    validate(config, source)
    return config


def _set_overrides(config: Config, overrides: list[str] | tuple[str, ...], only: str | None = None) -> None:
    """Each `section.key=value` set on `config`, its value checked against its key's spec ("command line")."""
    import yaml
    for override in sorted(overrides, key=lambda o: not o.partition("=")[0].strip().lstrip("-").endswith(TYPE_KEY)):
        # the decoder's type first: it says which keys the others may name
        key, sep, text = override.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {override!r}: expected section.key=value")
        key = key.strip().lstrip("-")
        if only is not None and not key.startswith(only):
            raise ConfigError(f"override {override!r}: only {only}* keys can be set here")
        try:
            value = parse_yaml(text, f"command line's {key}", "config value", ConfigError, max_aliases=None)
        except yaml.YAMLError:
            value = text
        _set_dotted(config, key, value, "command line")


def config_from_dict(raw: dict[str, Any], source: str = "checkpoint") -> Config:
    """A stored config (`Config.to_dict`), upgraded from an older layout (core/upgrade.py), checked."""
    config = Config()
    _merge(config, upgrade_run_config(raw), "", source)
    validate(config, source)
    return config


TYPE_KEY = "model.decoder.type"


def section_from_dict(kind: type, raw: Any, prefix: str, source: str) -> Any:
    """One section (`kind`, e.g. EncoderConfig) from a stored mapping, checked; `prefix` names its keys."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {prefix.rstrip('.')!r} must be a mapping, got {raw!r}")
    node = kind()
    _merge(node, raw, prefix, source)
    for dotted, f, annotation in leaf_fields(node, prefix):
        _check_leaf(get_dotted(node, dotted.removeprefix(prefix)), f, annotation, dotted, source)
    return node


def decoder_config(raw: Any, source: str) -> Any:
    """A `model.decoder` section (`type` and its keys) as its registered decoder's config, checked."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: 'model.decoder' must be a mapping, got {raw!r}")
    kind = decoder_type(raw.get("type"), repr(TYPE_KEY), source).config
    config = section_from_dict(kind, {k: v for k, v in raw.items() if k != "type"}, "model.decoder.", source)
    raise_problem(getattr(config, "problem", lambda: None)(), source)  # a decoder's rule that ties its keys together
    return config


def _merge(node: Any, raw: dict[str, Any], prefix: str, source: str) -> None:
    names = {f.name: f for f in dataclasses.fields(node)}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            _another_decoders(node, key, value, dotted, source)
            continue
        current = getattr(node, key)
        if names[key].metadata.get("decoder") and isinstance(value, dict):
            current = _switch_decoder(node, key, value.get("type", type_of(current)), dotted, source)
            value = {k: v for k, v in value.items() if k != "type"}
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {dotted!r} must be a mapping, got {value!r}")
            _merge(current, value, dotted + ".", source)
        else:
            setattr(node, key, _checked(value, node, key, dotted, source))


def _switch_decoder(node: Any, key: str, name: Any, dotted: str, source: str) -> Any:
    """Make `node.key` a config of decoder type `name`, keeping the values set of keys both types have."""
    current, kind = getattr(node, key), decoder_type(name, repr(f"{dotted}.type"), source).config
    if type(current) is not kind:
        own = {f.name for f in dataclasses.fields(kind)}
        kept = {f.name: getattr(current, f.name) for f in dataclasses.fields(current)
                if f.name in own and getattr(current, f.name) != f.default}
        setattr(node, key, kind(**kept))
    return getattr(node, key)


def _another_decoders(node: Any, key: str, value: Any, dotted: str, source: str) -> None:
    """A key `node` does not have: in a decoder's section, another registered decoder's key is checked
    and left unused (one file can set up either decoder); anything else is an unknown key."""
    decoders = [decoder_type(name).config for name in registered()]
    owner = next((kind() for kind in decoders if hasattr(kind(), key)), None) if type(node) in decoders else None
    if owner is None or dataclasses.is_dataclass(getattr(owner, key)):
        raise ConfigError(f"{source}: unknown key {dotted!r}{_suggest(dotted)}")
    _checked(value, owner, key, dotted, source)


def _set_dotted(config: Config, dotted: str, value: Any, source: str) -> None:
    *parents, leaf = dotted.split(".")
    node: Any = config
    for part in parents:
        if not dataclasses.is_dataclass(node) or not hasattr(node, part):
            raise ConfigError(f"{source}: unknown key {dotted!r}{_suggest(dotted)}")
        node = getattr(node, part)
    if dotted == TYPE_KEY:
        _switch_decoder(config.model, "decoder", value, "model.decoder", source)
        return
    if not dataclasses.is_dataclass(node) or leaf not in {f.name for f in dataclasses.fields(node)}:
        _another_decoders(node, leaf, value, dotted, source)
        return
    if dataclasses.is_dataclass(getattr(node, leaf)):
        raise ConfigError(f"{source}: {dotted!r} is a section; set one of its keys, e.g. {dotted}.KEY=VALUE")
    setattr(node, leaf, _checked(value, node, leaf, dotted, source))


def _checked(value: Any, node: Any, name: str, dotted: str, source: str) -> Any:
    """The value (as this version names it) converted to the key's type and checked against its spec."""
    f = {f.name: f for f in dataclasses.fields(node)}[name]
    return _check_leaf(upgrade_value(dotted, value), f, _type_hints(type(node))[name], dotted, source)


# A section's annotations, resolved once per class (this cost more than the rest of reading a config).
_type_hints = functools.cache(typing.get_type_hints)


# what a key of each type takes, converted to the type (YAML reads 3 where a float key means 3.0)
ACCEPTS = {bool: (bool,), int: (int,), float: (int, float), str: (str, int, float)}


def _coerce(value: Any, annotation: Any, dotted: str, source: str) -> Any:
    """Check a value against a field's annotation (int, float, str, bool, or X | None)."""
    allowed = _kinds(annotation)
    if value is None:
        if type(None) in allowed:
            return None
        raise ConfigError(f"{source}: {dotted!r} must not be empty (null)")
    for kind in allowed:  # a bool is an int to Python, never to a config: only a bool key takes one
        if isinstance(value, ACCEPTS.get(kind, ())) and (kind is bool) == isinstance(value, bool):
            return kind(value)
    raise ConfigError(f"{source}: {dotted!r} must be {type_words(annotation)}; got {value!r}")


def _kinds(annotation: Any) -> tuple[Any, ...]:
    """The types an annotation allows: each of a union's (`float | None`), else itself."""
    union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
    return typing.get_args(annotation) if union else (annotation,)


def type_words(annotation: Any) -> str:
    """An annotation as the refusals and `captioner config keys` name it: "float or null"."""
    return " or ".join("null" if k is type(None) else getattr(k, "__name__", str(k)) for k in _kinds(annotation))


def leaf_fields(node: Any = None, prefix: str = "") -> list[tuple[str, dataclasses.Field, Any]]:
    """Every key as (dotted name, field, type), walked from the dataclasses; without `node`, every key
    a config may hold, those of every registered decoder included."""
    if node is None:
        return _every_key()
    leaves = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            leaves += leaf_fields(value, f"{prefix}{f.name}.")
        else:
            leaves.append((f"{prefix}{f.name}", f, _type_hints(type(node))[f.name]))
    return leaves


def _every_key() -> list[tuple[str, dataclasses.Field, Any]]:
    """The keys with each registered decoder in turn, each once, and `model.decoder.type`."""
    kind_key: dataclasses.Field = dataclasses.field(metadata={"spec": Choice(tuple(registered()))})
    kind_key.name = "type"
    keys: dict[str, tuple[str, dataclasses.Field, Any]] = {TYPE_KEY: (TYPE_KEY, kind_key, str)}
    for kind in (decoder_type(name).config for name in registered()):
        for leaf in _leaves_of(Config, kind):
            keys.setdefault(leaf[0], leaf)
    return list(keys.values())


@functools.cache
def _leaves_of(config_class: type, decoder_class: type) -> tuple[tuple[str, dataclasses.Field, Any], ...]:
    """The keys of a config class with a decoder config class, walked once."""
    config = config_class()
    config.model.decoder = decoder_class()
    return tuple(leaf_fields(config))


def _suggest(dotted: str) -> str:
    match = difflib.get_close_matches(dotted, [key for key, _, _ in leaf_fields()], n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def get_dotted(config: Config, dotted: str) -> Any:
    return functools.reduce(getattr, dotted.split("."), config)


def _check_leaf(value: Any, f: dataclasses.Field, annotation: Any, dotted: str, source: str) -> Any:
    """A key's value converted to its type and checked against its spec, also for values set in code."""
    spec = f.metadata.get("spec")
    if spec is None:  # a programming error, not a user's: declare the key with `setting`
        raise TypeError(
            f"config key {dotted!r} has no spec: declare it as `{f.name}: T = setting(default, Range/Choice/...)`")
    kind = spec.kind if isinstance(spec, DecodeOption) else annotation
    if isinstance(value, str) and float in _kinds(kind):  # YAML 1.1 reads 1e-3 (no dot) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(spec, DecodeOption):  # judged by the option alone, so refused in the library's words
        if not spec.allows(value):
            raise ConfigError(f"{source}: {dotted!r} must be {spec.describe()}; got {value!r}")
        return spec.converted(value)
    value = _coerce(value, annotation, dotted, source)
    if not spec.allows(value):
        finite = "a finite number " if isinstance(value, float) and not math.isfinite(value) else ""
        raise ConfigError(f"{source}: {dotted!r} must be {finite}{spec.describe()}; got {value!r}")
    return value


def validate(config: Config, source: str = "config") -> None:
    """Every key against its spec, then the rules that tie keys together."""
    for dotted, f, annotation in _leaves_of(Config, type(config.model.decoder)):
        _check_leaf(get_dotted(config, dotted), f, annotation, dotted, source)
    raise_problem(getattr(config.model.decoder, "problem", lambda: None)(), source)  # the decoder's own rule
    if config.train.warmup_epochs is not None and config.train.warmup_steps is not None:
        raise ConfigError(f"{source}: 'train.warmup_epochs' ({config.train.warmup_epochs:g}) and 'train.warmup_steps' "
                          f"({config.train.warmup_steps}) are both set; keep one and set the other to null (epochs "
                          "mean the same at any number of GPUs)")
    if config.data.val_fraction + config.data.test_fraction >= 1:
        raise ConfigError(f"{source}: 'data.val_fraction' ({config.data.val_fraction:g}) and 'data.test_fraction' "
                          f"({config.data.test_fraction:g}) leave no training images: their sum must be below 1")
    if config.data.dataset == "karpathy" and not config.data.karpathy_file:
        raise ConfigError(f"{source}: 'data.karpathy_file' is required when 'data.dataset' is karpathy")
    if config.data.dataset == "webdataset":
        missing = [key for key in ("train_shards", "val_shards") if not getattr(config.data, key)]
        if missing:
            raise ConfigError(f"{source}: 'data.{missing[0]}' is required when 'data.dataset' is webdataset (a brace "
                              "pattern of shards)")
        if config.train.stage == "scst":
            raise ConfigError(f"{source}: 'train.stage' scst needs every training image's references before it "
                              "starts, which streamed shards do not give: train the cross-entropy stage on the shards, "
                              "then SCST on an image folder or a Hugging Face dataset (data.dataset imagefolder or hf)")
    scst = config.scst
    if scst.baseline == "mean" and scst.samples < 2:
        raise ConfigError(f"{source}: 'scst.baseline' mean needs 'scst.samples' >= 2 (the other samples of the image), "
                          f"got {scst.samples}")
    if scst.cider_weight == 0 and scst.bleu_weight == 0:
        raise ConfigError(f"{source}: 'scst.cider_weight' and 'scst.bleu_weight' are both 0: the reward would be 0")
    raise_problem(combination_problem(dataclasses.asdict(config.decode)), f"{source}: decode")


def check_new_config(config: Config, source: str = "config") -> None:
    """The rules for a config a user gives (a file, overrides), not for a checkpoint's: a model trained before a
    rule came keeps loading. A shapes world below SHAPES_MIN_IMAGE_SIZE is refused here, before any folder is made,
    whether the world is generated at that size or an existing one resized to it: its shapes would be a blot."""
    size = config.data.image_size
    if config.data.dataset == "shapes" and size < SHAPES_MIN_IMAGE_SIZE:
        raise ConfigError(f"{source}: 'data.image_size' {size} is too small for the shapes world (at least "
                          f"{SHAPES_MIN_IMAGE_SIZE} pixels: below it a star, a diamond and a square draw as the same "
                          "few pixels)")


def dump_config(config: Config, path: str | Path) -> None:
    import yaml
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
