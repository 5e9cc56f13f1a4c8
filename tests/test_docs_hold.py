"""What the README and docs/ name exists: every relative link (and its #anchor), every file path
of the project written in backticks, every config key, and every option of every `captioner`
command line in them. A renamed option, key, file or heading fails here, not in a user's hands."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
from helpers import REPO

from captioner.apps.cli import build_parser
from captioner.core.config import leaf_fields

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SECTIONS = ("data", "model", "train", "scst", "decode")
KEYS = {dotted for dotted, _, _ in leaf_fields()}
KEY_PREFIXES = {".".join(k.split(".")[:n]) for k in KEYS for n in range(1, k.count(".") + 1)}
PROJECT_DIRS = ("configs", "scripts", "benchmarks", "tests", "captioner", "docs", "runtime")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    found: dict[str, int] = {}
    result = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.M):
        base = slug(heading)
        n = found.get(base, 0)
        result.add(base if n == 0 else f"{base}-{n}")  # a repeated heading gets -1, -2, ...
        found[base] = n + 1
    return result


def page_id(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_links_and_their_anchors_exist(page: Path) -> None:
    text = page.read_text()
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no heading with that anchor in {file.name})")
    assert not broken, f"{page_id(page)}: " + "; ".join(broken)


def project_paths(text: str) -> set[str]:
    """Paths of this repository written in backticks or commands (configs/x.yaml, scripts/y.sh, ...);
    not COMMIT:path (a file of another commit) nor patterns and placeholders."""
    found = set()
    pattern = rf"(?<![\w./:-])((?:{'|'.join(PROJECT_DIRS)})/[\w./{{}}*<>,-]*[\w}}>*])"
    for path in re.findall(pattern, text):
        if re.search(r"[*<>{}A-Z]", path) or path.endswith("/"):
            continue  # a pattern or a placeholder (configs/flickr8k_lstm_liteN.yaml), not a file
        found.add(path.rstrip("."))
    return found


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_project_files_named_exist(page: Path) -> None:
    text = page.read_text()
    named = project_paths(" ".join(CODE_SPAN.findall(text)) + "\n" + "\n".join(FENCE.findall(text)))
    missing = sorted(p for p in named if not (REPO / p).exists() and not (page.parent / p).exists())
    assert not missing, f"{page_id(page)} names files that do not exist: {missing}"


FILE_SUFFIXES = (".py", ".json", ".safetensors", ".done", ".pt", ".yaml", ".md", ".csv", ".png", ".npy")


def config_keys(text: str) -> set[str]:
    """Keys written as a whole code span (`train.cpu_amp`, `data.root=...`) or as an override
    (`key=value`) in a command; `model.caption(...)` in Python code is not a key."""
    key = rf"(?:{'|'.join(SECTIONS)})\.[a-z_][a-z0-9_.]*[a-z0-9_]"
    keys = {m.group(1) for span in CODE_SPAN.findall(text) if (m := re.fullmatch(rf"({key})(?:=.*)?", span.strip()))}
    for block in FENCE.findall(text):
        keys |= set(re.findall(rf"(?<![\w./-])({key})=", block))
    return {k for k in keys if not k.endswith(FILE_SUFFIXES)}


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_config_keys_named_exist(page: Path) -> None:
    unknown = sorted(k for k in config_keys(page.read_text()) if k not in KEYS and k not in KEY_PREFIXES)
    assert not unknown, f"{page_id(page)} names config keys that do not exist: {unknown}"


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def command_options(words: list[str]) -> tuple[str, set[str], list[str]]:
    """The command path of a `captioner ...` line, the options its parser knows, the options used."""
    parser, path = build_parser(), []
    rest = words
    while rest and rest[0] in subcommands(parser):
        parser = subcommands(parser)[rest[0]]
        path.append(rest[0])
        rest = rest[1:]
    known = {option for action in parser._actions for option in action.option_strings}
    used = [w.split("=", 1)[0] for w in rest if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", w)]
    return " ".join(path), known, used


def command_lines(text: str) -> list[str]:
    lines = []
    for block in FENCE.findall(text):
        joined = block.replace("\\\n", " ")
        lines += [line.strip() for line in joined.splitlines() if re.match(r"\s*(captioner|python -m captioner)\s", line)]
    lines += [span for span in CODE_SPAN.findall(text) if re.match(r"captioner\s+[a-z]", span)]
    return lines


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_command_lines_use_options_that_exist(page: Path) -> None:
    wrong = []
    for line in command_lines(page.read_text()):
        line = line.split(" #", 1)[0].split("|", 1)[0].split("&&", 1)[0]
        try:
            words = shlex.split(line.replace("[", " ").replace("]", " "))
        except ValueError:
            continue  # an unbalanced quote in prose: nothing to check
        words = words[3:] if words[:3] == ["python", "-m", "captioner"] else words[1:]
        path, known, used = command_options(words)
        wrong += [f"captioner {path} {option}" for option in used if option not in known]
    assert not wrong, f"{page_id(page)} uses options the command does not have: {sorted(set(wrong))}"


def test_the_module_tables_of_the_architecture_page_are_the_codes() -> None:
    """docs/architecture.md's line counts and jobs, as scripts/architecture_table.py writes them
    from the code: a new module, a grown one or a changed docstring makes the page stale."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("architecture_table", REPO / "scripts" / "architecture_table.py")
    assert spec is not None and spec.loader is not None
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    page = table.PAGE.read_text()
    assert table.rewritten(page) == page, "docs/architecture.md is stale: run python scripts/architecture_table.py"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_no_issue_numbers_in_user_facing_prose(page: Path) -> None:
    """A user cannot see the project's issue tracker: "issue 28", "issues 21 and 22", "#21"."""
    found = re.findall(r"(?i)\bissues? #?\d+|(?<![\w&/])#\d+\b", FENCE.sub("", page.read_text()))
    assert not found, f"{page_id(page)} refers to issues by number: {sorted(set(found))}"
