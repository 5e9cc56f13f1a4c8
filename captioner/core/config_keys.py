"""Every config key with its meaning (`captioner config keys`), and a resolved config as YAML.

A key's meaning is the comment on (else just above) its declaration, else its decoding option's: it cannot drift.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import tokenize
import typing
from dataclasses import dataclass
from typing import Any

import yaml

from captioner.core.config import type_words
from captioner.core.config_sections import Config
from captioner.core.decode_schema import DecodeOption
from captioner.core.decoder_types import DEFAULT, decoder_type, registered
from captioner.core.specs import Choice


@dataclass(frozen=True)
class Key:
    name: str  # dotted, as overrides and YAML files name it: "model.encoder.name"
    type: str  # "int", "float or null", ...
    default: Any
    allowed: str  # the spec's words: "a whole number in [1, 100]", "one of lstm, transformer"
    meaning: str


@functools.cache
def _comments(cls: type) -> tuple[dict[int, str], dict[int, str], dict[str, int]]:
    """The comments of `cls`'s module by line (after code; alone on a line), and `cls`'s fields' lines."""
    source = inspect.getsource(inspect.getmodule(cls))
    inline, alone = {}, {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip()
            (alone if token.line.strip().startswith("#") else inline)[token.start[0]] = text
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    lines = {item.target.id: item.lineno for item in node.body
             if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)}
    return inline, alone, lines


def _meaning(cls: type, name: str, spec: Any) -> str:
    inline, alone, lines = _comments(cls)
    line = top = lines[name]
    if line in inline:
        return inline[line]
    while top - 1 in alone:  # the block of comments just above
        top -= 1
    if top < line:
        return " ".join(alone[n] for n in range(top, line))
    return spec.meaning if isinstance(spec, DecodeOption) else ""


def config_keys() -> list[Key]:
    """Every key of `Config`, in declaration order; in `model.decoder`, its type, then each
    registered decoder's keys, their meaning prefixed with the decoder's name."""
    keys: list[Key] = []

    def walk(cls: type, prefix: str, owner: str = "") -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.metadata.get("decoder"):
                names = registered()
                keys.append(Key(f"{prefix}{f.name}.type", "str", DEFAULT, Choice(tuple(names)).describe(),
                                "the decoder: " + ", ".join(f"{n} ({decoder_type(n).module.__name__})" for n in names)))
                for name in names:
                    walk(decoder_type(name).config, f"{prefix}{f.name}.", f"{name}: ")
                continue
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                walk(hint, f"{prefix}{f.name}.")
                continue
            spec = f.metadata["spec"]
            keys.append(Key(prefix + f.name, type_words(hint), f.default, spec.describe(),
                            owner + _meaning(cls, f.name, spec)))

    walk(Config, "")
    return keys


def format_keys(keys: list[Key]) -> str:
    """One block per key: the name, its type and default, what it allows, what it means."""
    out = []
    for key in keys:
        default = yaml.safe_dump(key.default, default_flow_style=True).strip().removesuffix("...").strip()
        out.append(f"{key.name}  ({key.type}, default {default})\n    allowed: {key.allowed}\n    {key.meaning}")
    return "\n".join(out)


def show_config(config: Config) -> str:
    """The resolved config as YAML, in the layout of the files under configs/."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
