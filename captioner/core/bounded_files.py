"""What a model or dataset brings, held within bounds (docs/export.md): its data files read within a size
cap and a depth measured before parsing (past a limit: one error line, never a RecursionError or a read of
gigabytes); the places it names kept inside their folder, compared by real paths, links and all (the user's
own places are followed, not judged here)."""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from captioner.core.errors import CaptionerError, ExportError
from captioner.core.files import size_text

# config.json, vocab.json, onnx.json and a safetensors header: a 100,000-word vocabulary takes about 1.5 MB
MODEL_JSON_BYTES = 16 * 2**20
SCORES_JSON_BYTES = 32 * 2**20  # scores_<split>.json: its per-image rows, about 300 bytes an image
CARD_BYTES = 2**20  # a model card (README.md): a few kilobytes
MAX_DEPTH = 32  # nesting of objects and lists; a model's files nest 5 deep
# YAML aliases in a card's metadata (captioner writes none): 20 expand to at most a few thousand nodes
MAX_ALIASES = 20

# A JSON string, escapes included; one left open runs to the end. Every quote starts a match that
# succeeds, so the scan is linear whatever the text (a pattern that can fail rescans from each quote).
STRING = re.compile(r'"[^"\\]*(?:\\.?[^"\\]*)*(?:"|\Z)', re.DOTALL)
NOT_BRACKET = re.compile(r"[^\[\]{}]+")
STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def read_capped(path: str | Path, what: str, max_bytes: int, error: type[CaptionerError]) -> bytes:
    """At most `max_bytes` of the regular file `path`, else one `error` line. A folder, a pipe or a device is refused
    before it is opened: opening a FIFO waits forever for a writer, a device may never end. FileNotFoundError is the
    caller's to word."""
    path = Path(path)
    try:
        check_regular_file(path, what, error)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise error(f"{path}: {size_text(size)}, more than the {size_text(max_bytes)} a {what} may take; "
                            "refused")
            data = f.read(size + 1)  # a file still growing: never more than its size and one byte
    except (FileNotFoundError, CaptionerError):
        raise
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise error(f"{path}: more than the {size_text(max_bytes)} a {what} may take; refused")
    return data


def check_regular_file(path: Path, what: str, error: type[CaptionerError]) -> None:
    """Refuse `path` in one `error` line unless it is a regular file (links followed): a folder, a pipe, a device
    or a socket. FileNotFoundError is the caller's to word."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror or e})") from None
    if stat.S_ISDIR(mode):
        raise error(f"{path}: {what} is a folder, not a file")
    if not stat.S_ISREG(mode):
        raise error(f"{path}: {what} is not a regular file (a pipe, a device or a socket); give a file")


def read_text_file(path: str | Path, what: str, error: type[CaptionerError], max_bytes: int = sys.maxsize) -> str:
    """A regular file's UTF-8 text, at most `max_bytes`; else one `error` line naming `path` and `what`.
    FileNotFoundError is the caller's to word."""
    data = read_capped(path, what, max_bytes, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: {what} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def nests_deeper_than(text: str, levels: int) -> bool:
    """Whether a JSON text nests more than `levels` deep: its brackets outside strings, counted in C loops."""
    if text.count("[") + text.count("{") <= levels:  # fewer openings than levels: most files, at once
        return False
    brackets = NOT_BRACKET.sub("", STRING.sub("", text))
    return max(itertools.accumulate(map(STEP.__getitem__, brackets)), default=0) > levels


def loads_json(text: str, where: str, error: type[CaptionerError]) -> Any:
    """`json.loads(text)`; what it raises besides invalid JSON (JSONDecodeError, the caller's to word) is one `error`
    line naming `where`: nesting past Python's recursion limit (a RecursionError), an integer of more digits than
    Python converts (a ValueError telling the programmer about sys.set_int_max_str_digits)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise error(f"{where}: not valid JSON here: lists or objects nested hundreds of levels deep") from None
    except ValueError:
        raise error(f"{where}: not valid JSON here: a number of thousands of digits, more than Python reads") from None


def read_json(path: str | Path, what: str, error: type[CaptionerError], max_bytes: int = MODEL_JSON_BYTES) -> Any:
    """A JSON file a model brings, within its caps; a failure is one `error` line (FileNotFoundError aside)."""
    return parse_json(read_capped(path, what, max_bytes, error), str(path), what, error)


def parse_json(data: bytes, source: str, what: str, error: type[CaptionerError]) -> Any:
    """JSON bytes a model brings (already within their cap), their depth measured before parsing; a failure is
    one `error` line naming `source`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{source}: not valid JSON (not UTF-8 text: {e.reason} at byte {e.start})") from None
    if nests_deeper_than(text, MAX_DEPTH):
        raise error(f"{source}: nested deeper than the {MAX_DEPTH} levels a {what} may have; refused")
    try:
        return loads_json(text, source, error)
    except json.JSONDecodeError as e:
        raise error(f"{source}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None


def read_scores_json(path: str | Path, error: type[CaptionerError],
                     max_bytes: int = SCORES_JSON_BYTES) -> dict[str, Any]:
    """A scores_<split>.json as `captioner evaluate` writes it, its JSON object, read within `max_bytes` (by default
    the cap of a model's: a user's own evaluation may pass a larger one) and MAX_DEPTH; anything else one `error` line
    naming `path`. FileNotFoundError is the caller's to word."""
    document = read_json(path, "scores file", error, max_bytes)
    if not isinstance(document, dict):
        raise error(f"{path}: not a scores file (a JSON {type(document).__name__}, not an object)")
    return document


def read_format_json(path: Path, what: str, kind: str, expected: str, error: type[CaptionerError],
                     missing: str = "missing") -> dict[str, Any]:
    """A model's JSON document whose "format" must be `expected` (a `kind`, such as "captioner export"):
    read within its caps, every refusal one `error` line naming `path`."""
    try:
        document = read_json(path, what, error)
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    if not isinstance(document, dict) or document.get("format") != expected:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise error(f"{path}: not a {kind} (format {found!r}, expected {expected!r})")
    return document


def load_yaml(text: str, source: str, what: str, error: type[CaptionerError]) -> Any:
    """YAML text from a model (a card's metadata), safely: one `error` line when it nests too deep,
    holds too many aliases or does not parse."""
    import yaml

    try:
        return parse_yaml(text, source, what, error)
    except yaml.YAMLError as e:
        raise error(f"{source}: not valid YAML ({' '.join(str(e).split())[:160]})") from None


def parse_yaml(text: str, source: str, what: str, error: type[CaptionerError],
               max_aliases: int | None = MAX_ALIASES, unique_keys: bool = False) -> Any:
    """YAML text parsed safely, its nesting bounded: one `error` line past MAX_DEPTH levels (never a
    RecursionError from the composer or from whatever walks the result), past `max_aliases` aliases (None:
    any number, as in a user's own config) or at a scalar Python cannot convert (a ValueError). `unique_keys`:
    a key given twice in one mapping is an `error` line, where YAML keeps the last silently (a config's second
    `lr:` would win unseen). Text that does not parse raises yaml.YAMLError, the caller's to word."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        """SafeLoader that counts the aliases it meets and the depth it composes at."""

        aliases = 0
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if max_aliases is not None and self.aliases > max_aliases:
                    raise error(f"{source}: more than the {max_aliases} YAML aliases a {what} may hold; refused")
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise error(f"{source}: nested deeper than the {MAX_DEPTH} levels a {what} may have; refused")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            if unique_keys and isinstance(node, yaml.MappingNode):
                lines: dict[str, int] = {}
                for key, _ in node.value:
                    if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                        continue  # a merge (<<) may set a key again: that is what it is for
                    line = key.start_mark.line + 1
                    if key.value in lines:
                        raise error(f"{source}: {key.value!r} is given twice in one section (lines {lines[key.value]} "
                                    f"and {line}); YAML would keep the second silently")
                    lines[key.value] = line
            return super().construct_mapping(node, deep)

    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    except ValueError as e:  # a date past the calendar (2001-13-45), an integer of more digits than Python converts
        raise error(f"{source}: not valid YAML here: a value Python cannot read ({str(e).split(';')[0]})") from None
    finally:
        loader.dispose()


def is_within(path: str, base: str) -> bool:
    """Whether real path `path` is `base` or lies below it (both already resolved)."""
    try:
        return os.path.commonpath([path, base]) == base
    except ValueError:  # another drive
        return False


class Confinement:
    """Names checked against one folder, each folder resolved once (one lstat a file)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = str(folder)
        self.base = os.path.realpath(self.folder)
        self._realpath = functools.cache(os.path.realpath)  # of the folders names lie in

    def escape(self, name: str | Path) -> str | None:
        """Where `name` (relative or absolute) leads when that is outside the folder, else None."""
        head, tail = os.path.split(os.path.join(self.folder, name))
        target = os.path.join(self._realpath(head), tail)
        if os.path.islink(target):
            target = os.path.realpath(target)
        return None if is_within(target, self.base) else target


def escapes(name: str | Path, folder: str | Path) -> str | None:
    """`Confinement(folder).escape(name)`, for one name."""
    return Confinement(folder).escape(name)


def model_base(folder: Path) -> Path:
    """What a model's files may lead to: `folder` itself, or, for a Hub cache snapshot (or a folder in one), its
    repo's folder, whose blobs the snapshot's files link to."""
    for snapshot in (folder, *folder.parents[:2]):
        if snapshot.parent.name == "snapshots" and snapshot.parent.parent.name.startswith("models--"):
            return snapshot.parent.parent
    return folder


def own_file(folder: Path, name: Any, listed_in: str) -> Path:
    """`folder`/`name`, a file of the model's own: a relative name (`listed_in` says where it was read) whose real
    path, links followed, stays in `folder` (`model_base`); else one ExportError, before it is read."""
    parts = Path(name).parts if isinstance(name, (str, Path)) else ()
    if not parts or Path(name).is_absolute() or ".." in parts:
        raise ExportError(f"{listed_in}: {name!r} is not a file name inside the model's folder; refused")
    base = model_base(folder)
    if (target := escapes(folder.relative_to(base) / name, base)) is not None:
        raise ExportError(f"{folder / name}: a link leading out of the model's folder (to {target}); refused")
    return folder / name
