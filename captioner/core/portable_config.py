"""What a model carries of the run that trained it: the recipe, never the folders of the machine that made it.

Each `Place` key is written as its spec's `travels` says (last component, run name or null; "unnamed" where
none fits); undeclared keys' path-like text keeps its last component. Every writer goes through here.
"""

from __future__ import annotations

import copy
import re
import shlex
from typing import Any

from captioner.core.config import leaf_fields
from captioner.core.specs import Place

UNNAMED = "unnamed"  # what a place that names nothing portable becomes where the config needs a value
NAME = re.compile(r"(?!\.{1,2}$)[\w{]([\w.{} -]{0,98}[\w.{}-])?")  # a file or folder name, spaces and braces included
SEPARATORS = re.compile(r"[/\\]+")  # between the components of a path or a URL
COMMAND = "pipe:"  # a shard command: its last word is the pattern it reads
PATH_LIKE = re.compile(r"[/\\]|^~")  # text that names a place
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt")


def place_keys() -> dict[str, tuple[Place, Any]]:
    """Dotted key -> its spec and default, for every key of the config that names a place."""
    return {dotted: (f.metadata["spec"], f.default) for dotted, f, _ in leaf_fields()
            if isinstance(f.metadata.get("spec"), Place)}


def components(value: str) -> list[str]:
    """The components of a path or URL; of a shard command, those of its last word."""
    if value.startswith(COMMAND):
        try:
            words = shlex.split(value[len(COMMAND):])
        except ValueError:  # an unclosed quote: the command's plain words
            words = value[len(COMMAND):].split()
        value = (words or [""])[-1]
    return [part for part in SEPARATORS.split(value) if part]


def last_name(value: str, run: bool = False) -> str | None:
    """The last component of a path, URL or command when it is a plain name, else None; `run`: the run
    a checkpoint path points into, x of runs/x/best.pt or runs/x, else a lone file's name."""
    parts = components(value)
    if run and len(parts) > 1 and parts[-1].endswith(CHECKPOINT_SUFFIXES):
        parts = parts[:-1]
    return parts[-1] if parts and NAME.fullmatch(parts[-1]) else None


def portable_value(value: Any, spec: Place, default: Any = None) -> str | None:
    """What a model carries of a place: None for "null" keys and unset ones; the key's own default
    (a project place such as data/shapes); else a name."""
    if value is not None and value == default:
        return value
    if value is None or spec.travels == "null":
        return None
    name = last_name(value, run=spec.travels == "run") if isinstance(value, str) else None
    return name or UNNAMED


def value_at(stored: dict[str, Any], dotted: str) -> Any:
    """The value of a dotted key in a stored config (a dict of sections); None where it has none."""
    node: Any = stored
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def portable_config(stored: dict[str, Any]) -> dict[str, Any]:
    """A copy of a stored run config in which no key names a place of the machine that wrote it."""
    portable = copy.deepcopy(stored)
    for dotted, (spec, default) in place_keys().items():
        section, _, key = dotted.rpartition(".")
        node = value_at(portable, section)
        if isinstance(node, dict) and key in node:
            node[key] = portable_value(node[key], spec, default)
    strip_undeclared_paths(portable)
    return portable


def strip_undeclared_paths(node: Any) -> None:
    """Text under keys this version does not declare that holds a path separator: its last
    component (an older version's place, whatever its name)."""
    declared = {dotted for dotted, _, _ in leaf_fields()}  # every declared key, places included
    stack = [(node, "")]
    while stack:  # a stored config may nest as deep as its reader let it: no recursion here
        current, at = stack.pop()
        for key, value in list(current.items()) if isinstance(current, dict) else []:
            dotted = f"{at}{key}"
            if isinstance(value, dict):
                stack.append((value, dotted + "."))
            elif isinstance(value, str) and dotted not in declared and PATH_LIKE.search(value):
                current[key] = last_name(value) or UNNAMED
