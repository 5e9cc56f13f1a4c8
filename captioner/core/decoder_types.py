"""The decoder types a config may name, each with its config dataclass: the table `@register_decoder`
(models/decoder.py) fills, torch-free so that configs and specs read it. A type resolves only among
captioner's own (`BUILTIN`), those registered by imported code, and those an installed package declares
in the `captioner.decoders` entry point group (`gru = "my_package.gru"`), imported when first named."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

from captioner.core.errors import ConfigError

# an installed package's decoders: name = "package.module" (importing it registers them)
ENTRY_POINTS = "captioner.decoders"
BUILTIN = {"lstm": "captioner.models.decoders.lstm", "transformer": "captioner.models.decoders.transformer"}
DEFAULT = "lstm"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecoderType:
    """A registered decoder: its config dataclass and module class (`module(config, vocab_size, feat_dim)`)."""

    name: str
    config: type
    module: Any


_TYPES: dict[str, DecoderType] = {}
_loaded: set[str] = set()  # entry points already imported
_points: list | None = None  # the group's entry points, read once per process (a scan takes ~10 ms)


def register(name: str, config: type, module: Any) -> None:
    """Add a decoder type; registering the same classes again (a module imported twice) is harmless."""
    if not dataclasses.is_dataclass(config) or "type" in {f.name for f in dataclasses.fields(config)}:
        raise TypeError(f"decoder {name!r}: its config must be a dataclass without a `type` field, got {config!r}")
    known = _TYPES.get(name)
    names = (config.__qualname__, module.__qualname__)  # not identity: a module imported again makes new classes
    if known is not None and (known.config.__qualname__, known.module.__qualname__) != names:
        where = f"{known.module.__module__}.{known.module.__qualname__}"
        raise ValueError(f"decoder type {name!r} is registered already, by {where}")
    _TYPES[name] = DecoderType(name, config, module)
    config.type = name  # not a field: `config.model.decoder.type` reads it, asdict leaves it out


def _load_entry_points(name: str | None = None) -> None:
    """Import captioner's decoders and the installed packages' (`name`'s, or all); a plug-in that fails
    to import is skipped with a warning."""
    for builtin, module in BUILTIN.items():
        if name in (None, builtin) and builtin not in _TYPES:
            import_module(module)
    global _points
    if name in BUILTIN:
        return
    if _points is None:
        _points = list(entry_points(group=ENTRY_POINTS))
    for point in _points:
        if point.value in _loaded or (name is not None and point.name != name):
            continue
        _loaded.add(point.value)
        try:
            point.load()
        except Exception as e:  # a third party's import error: name it and go on
            log.warning("decoder entry point %s = %s failed to import: %s", point.name, point.value, e)


def registered() -> list[str]:
    """Every decoder type's name, captioner's own first."""
    _load_entry_points()
    return sorted(_TYPES, key=lambda name: (name not in BUILTIN, name))


def decoder_type(name: Any, where: str = "'model.decoder.type'", source: str = "config") -> DecoderType:
    """The registered decoder `name`; one ConfigError naming the registered ones if there is none."""
    if isinstance(name, str) and name not in _TYPES:
        _load_entry_points(name)
    if not isinstance(name, str) or name not in _TYPES:
        raise ConfigError(f"{source}: {where} must be one of {', '.join(registered())}; got {name!r}")
    return _TYPES[name]


def type_of(config: Any) -> str:
    """The registered name of a decoder config instance."""
    return type(config).type


def default_decoder() -> Any:
    """The default decoder's config, at its defaults (the `model.decoder` section of a fresh config)."""
    return decoder_type(DEFAULT).config()


def section(config: Any) -> dict[str, Any]:
    """A decoder config as its YAML section and spec hold it: `type` first, then its keys."""
    return {"type": type_of(config), **dataclasses.asdict(config)}
