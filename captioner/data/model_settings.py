"""A model's stored settings are data (docs/export.md). Its shard patterns, URLs, commands and places out of the
working folder are set back to their defaults with one log line; dataset, columns and numbers are kept."""

from __future__ import annotations

import copy
import logging
import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import PurePosixPath

from captioner.core.config_sections import Config, DataConfig
from captioner.core.bounded_files import escapes
from captioner.core.errors import DatasetError
from captioner.data.records import ImageRecord

log = logging.getLogger(__name__)

SHARD_KEYS = ("train_shards", "val_shards", "test_shards")
PLACE_KEYS = ("root", "image_root", "karpathy_file", "feature_store")
# The data section's other text keys name no place (a test holds the three lists against DataConfig).
NAMES_NO_PLACE = ("dataset", "caption_column", "image_column", "captions_per_image", "device_preprocess")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # pipe:, http:, s3:, file:, a drive letter
SHOWN = 80  # characters of a set-aside value a message shows


@dataclass(frozen=True)
class StoredSettings:
    """A model's stored config made safe to read data with."""

    config: Config  # as stored, with every key of `set_aside` back at its default
    set_aside: dict[str, str]  # "data.root" -> the value the model's config gave it
    reasons: dict[str, str]  # "data.root" -> why it was set aside
    source: str  # where the config was stored: "runs/x/best.pt (config)"

    def unreadable(self, split: str) -> list[str]:
        """The keys set aside that `load_split(config.data, split)` would read."""
        from captioner.data.datasets import split_places  # the loaders (pycocotools) only when data is read

        places = split_places(self.config.data, split)
        return [key for key in self.set_aside if key.removeprefix("data.") in places]

    def load_split(self, split: str, check_images: bool = True) -> list[ImageRecord]:
        """The split's records, or one DatasetError naming the set-aside keys it would read."""
        if missing := self.unreadable(split):
            said = "; ".join(f"{key} {shown(self.set_aside[key])} ({self.reasons[key]})" for key in missing)
            give = " ".join(f"{key}=..." for key in missing)
            raise DatasetError(f"{self.source}: the {split} split is not read where the model's settings say: {said}; "
                               f"a model's settings are data, never a place to read: name the data yourself ({give})")
        from captioner.data.datasets import load_split

        return load_split(self.config.data, split, check_images)


def shown(value: str) -> str:
    """A stored value for a one-line message: quoted, escaped, cut short."""
    text = repr(value)
    return text if len(text) <= SHOWN else text[: SHOWN - 4] + "...'"


def outside_working_folder(value: str) -> bool:
    """Whether a path (lexically) leaves the working folder (absolute, `..`, `~`) or holds a control character."""
    if any(ord(c) < 32 or c == "\x7f" for c in value) or value.startswith("~"):
        return True
    parts = PurePosixPath(value.replace("\\", "/"))
    return parts.is_absolute() or os.path.isabs(value) or ".." in parts.parts


def place_problem(key: str, value: str, keep_local_places: bool) -> str | None:
    """Why a model's stored `data.<key>` may not be read, or None when it may."""
    if key in SHARD_KEYS:
        return "a shard pattern: webdataset opens it as a path, a URL or a shell command"
    if SCHEME.match(value):
        return "a URL or a command"
    if keep_local_places:
        return None
    if outside_working_folder(value):
        return ("a path outside the working folder, which only a checkpoint in the run folder it was written to "
                "may name")
    target = escapes(value, os.getcwd())
    return None if target is None else f"a link in the working folder that leads outside it, to {shown(target)}"


def stored_settings(config: Config, source: str, keep_local_places: bool = False,
                    named: Collection[str] = ()) -> StoredSettings:
    """`config` as a model stored it, what it may not name set aside; the dotted keys of `named` are kept."""
    set_aside: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for key in (*SHARD_KEYS, *PLACE_KEYS):
        dotted = f"data.{key}"
        value = getattr(config.data, key)
        if value is None or dotted in named:
            continue
        if (problem := place_problem(key, value, keep_local_places)) is not None:
            set_aside[dotted], reasons[dotted] = value, problem
    if not set_aside:
        return StoredSettings(config, {}, {}, source)
    safe = copy.deepcopy(config)
    defaults = DataConfig()
    for dotted in set_aside:
        key = dotted.removeprefix("data.")
        setattr(safe.data, key, getattr(defaults, key))
    log.warning("%s: not used, as a model's settings are data and never a place to read: %s",
                source, "; ".join(f"{key} {shown(value)} ({reasons[key]})" for key, value in set_aside.items()))
    return StoredSettings(safe, set_aside, reasons, source)
