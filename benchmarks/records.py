"""A benchmark run written as a record of docs/results/<measure>.json, the files scripts/render_results.py
turns into the results tables: its numbers, and the command, commit, processor, what ran beside and the
date taken from the run itself rather than copied by hand."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.timing import cores, kernels, line_of_text, processor
from captioner.core.errors import CaptionerError
from captioner.core.files import write_atomically
from captioner.core.machine_cache import held_kernels

REPOSITORY = Path(__file__).resolve().parents[1]
RESULTS = REPOSITORY / "docs" / "results"
ID = re.compile(r"[a-z0-9_]+")  # a record's id, as scripts/render_results.py checks it: it makes the page's anchor


def commit(repository: Path = REPOSITORY) -> str:
    """The checkout's short commit, with '+ uncommitted changes' where tracked files outside docs/ differ from
    it (an earlier run's records and the pages rendered from them change no code); a copy outside git says so
    rather than failing a run at its end."""
    def git(*args: str) -> str | None:
        done = subprocess.run(["git", "-C", str(repository), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    if head is None:
        return "unknown (not a git checkout)"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs")
    return head + (" + uncommitted changes" if changed else "")


def command_line(name: str, argv: Sequence[str], paths: Mapping[str, str] | None = None,
                 settings: Sequence[str] = ()) -> str:
    """`python -m benchmarks NAME ARGS`, after the settings that hold the kernels to an instruction set, the
    environment's `settings` the run read and a machine cache of its own, as the run had them. A path is the
    maker's, not the record's: the values of the options in `paths` are written as its placeholders
    (--profile DIR), and the cache's folder not at all."""
    held = [f"{key}={shlex.quote(value)}" for key, value in held_kernels().items()]
    held += [f"{key}={shlex.quote(os.environ[key].strip())}" for key in settings if os.environ.get(key, "").strip()]
    if os.environ.get("CAPTIONER_CACHE_DIR", "").strip():
        held.append("CAPTIONER_CACHE_DIR=<a folder of its own>")
    paths = paths or {}
    words = list(argv)
    for i, word in enumerate(words):
        option, equals, _ = word.partition("=")
        if option in paths and equals:
            words[i] = f"{option}={paths[option]}"
        elif word in paths and i + 1 < len(words):
            words[i + 1] = paths[word]
    return " ".join([*held, "python -m benchmarks", name, *map(shlex.quote, words)])


def machine() -> str:
    """The processor, its usable cores and the kernels torch runs on it (held to an instruction set or not)."""
    return f"{processor()}, {cores()} cores, {kernels()} kernels"


def add_record_options(parser: argparse.ArgumentParser, measure: str, what: str, prefix: bool = False) -> None:
    """`--record ID` (or PREFIX, for one record per row), `--replace` and, for a single record, `--label TEXT`:
    the run's `what` written into docs/results/<measure>.json."""
    name = "PREFIX" if prefix else "ID"
    each = "each as record PREFIX_NAME" if prefix else "as record ID"
    parser.add_argument("--record", metavar=name, default=None, type=record_id,
                        help=f"write {what} {each} of docs/results/{measure}.json, with this run's command, commit, "
                             "processor and date")
    parser.add_argument("--replace", action="store_true",
                        help="with --record: replace the records of those ids (without it, an id the file already "
                             "has stops the run before it starts)")
    if not prefix:
        parser.add_argument("--label", default=None, type=line_of_text,
                            help="the record's label (default: the processor, its cores and kernels)")


def record_id(text: str) -> str:
    """argparse type of --record: lower case letters, digits and _, as a record's id must be, refused before the
    run rather than written into docs/results where the pages could not render it."""
    if not ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r}: a record's id is lower case letters, digits and _")
    return text


def check_record_option(parser: argparse.ArgumentParser, args: argparse.Namespace, measure: str,
                        results: Path = RESULTS, ids: Sequence[str] | None = None) -> None:
    """Before the run: an empty --record, or --replace or --label without it, is a usage error, and a records file it
    could not write into, or that already has one of the run's `ids` (default: --record's) without --replace, stops
    here in one line rather than after minutes of measuring: an earlier measurement is never replaced by mistake."""
    if args.record is None:
        alone = [option for option, given in (("--replace", args.replace), ("--label", getattr(args, "label", None)))
                 if given]
        if alone:
            parser.error(f"{' and '.join(alone)} applies only with --record")
        return
    path, data, _ = records_file(measure, results)
    taken = sorted({record["id"] for record in data["records"]} & set(ids or [args.record]))
    if taken and not args.replace:
        raise SystemExit(f"{path}: already has record{'s' * (len(taken) > 1)} {', '.join(taken)}: give --record "
                         "another name, or --replace to replace them")


def records_file(measure: str, results: Path = RESULTS) -> tuple[Path, dict, int]:
    """results/<measure>.json, what it holds and its indent (1 or 2 in docs/results: a record written into it keeps
    the layout, so the change is the record's lines alone), checked before a run that will write into it: a file
    that cannot be read, is not a measure's records or cannot be written stops in one line."""
    path = results / f"{measure}.json"
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, ValueError) as e:
        raise SystemExit(f"{path}: cannot read the records ({e})") from None
    if not (isinstance(data, dict) and isinstance(data.get("columns"), list) and isinstance(data.get("records"), list)):
        raise SystemExit(f"{path}: not a measure's records (no list of columns and records)")
    if not all(isinstance(record, dict) and isinstance(record.get("id"), str) for record in data["records"]):
        raise SystemExit(f"{path}: not a measure's records (a record that is not an object with an id)")
    if not all(isinstance(column, dict) and "key" in column for column in data["columns"]):
        raise SystemExit(f"{path}: not a measure's records (a column that is not an object with a key)")
    if not os.access(path, os.W_OK):
        raise SystemExit(f"{path}: cannot be written")
    lines = text.splitlines()
    second = lines[1] if len(lines) > 1 else ""
    return path, data, len(second) - len(second.lstrip(" ")) or 1


def save_records(measure: str, records: Sequence[Mapping[str, object]], results: Path = RESULTS) -> Path:
    """Write `records` into results/<measure>.json at once, each in place of the record with its id or after the
    others; a number under a key the measure has no column for stops in one line, the file untouched."""
    path, data, indent = records_file(measure, results)
    columns = {column["key"] for column in data["columns"]}
    unknown = sorted({key for record in records for key in record["numbers"]} - columns)  # type: ignore[attr-defined]
    if unknown:
        raise SystemExit(f"{path}: no column for {', '.join(unknown)} (columns: {', '.join(sorted(columns))})")
    kept = data["records"]
    for record in records:
        ids = [old["id"] for old in kept]
        if record["id"] in ids:
            kept[ids.index(record["id"])] = dict(record)
        else:
            kept.append(dict(record))
    write_text(path, json.dumps(data, indent=indent, ensure_ascii=False) + "\n")
    return path


def write_text(path: Path, text: str) -> None:
    """`text` as the file at `path`, at once: a write that fails stops in one line, the previous file kept."""
    try:
        write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    except CaptionerError as e:
        raise SystemExit(str(e)) from None


def new_record(record_id: str, label: str | None, numbers: Mapping[str, str], command: str,
               beside: str | None) -> dict:
    """A record in the schema of docs/results (id, label, numbers, command, commit, processor, concurrent,
    date), the last four from this run; the label defaults to the processor line."""
    where = machine()
    return {"id": record_id, "label": label or where, "numbers": dict(numbers), "command": command,
            "commit": commit(), "processor": where, "concurrent": beside or "not said",
            "date": datetime.date.today().isoformat()}


def record_run(measure: str, args: argparse.Namespace, numbers: Mapping[str, str], command: str,
               results: Path = RESULTS, note: str | None = None) -> None:
    """A run of one row as record `args.record` (labelled `args.label`, beside `args.beside`) of
    results/<measure>.json, said in one line."""
    record = new_record(args.record, args.label, numbers, command, args.beside)
    if note:
        record["note"] = note
    path = save_records(measure, [record], results)
    print(f"\nrecord {args.record} written to {path}; python scripts/render_results.py puts it in the pages",
          flush=True)
