"""What the README and docs/ name exists: every relative link (and its #anchor), every file path
of the project written in backticks (each file a {a,b} pattern names, a file for each * pattern),
every config key, and the subcommands and options of every `captioner` command line in them. A
renamed option, subcommand, key, file or heading fails here, not in a user's hands.

A path or subcommand is left unchecked only where it is written as a placeholder: <name>, a word
in capitals (PATH, MODEL_DIR), or a capital closing a word (liteN, for lite0, lite1, ...). A name
with a capital and lower case letters after it (configs/Flickr8k.yaml) is a name, and is checked."""

from __future__ import annotations

import argparse
import functools
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


def anchors(page: Path) -> frozenset[str]:
    """The anchors of a page's headings, read once for each version of the file: a page links into results.md
    hundreds of times."""
    return page_anchors(page, page.stat().st_mtime_ns)


@functools.cache
def page_anchors(page: Path, version: int) -> frozenset[str]:
    text = FENCE.sub("", page.read_text())
    found: dict[str, int] = {}
    result = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.M):
        base = slug(heading)
        n = found.get(base, 0)
        result.add(base if n == 0 else f"{base}-{n}")  # a repeated heading gets -1, -2, ...
        found[base] = n + 1
    return frozenset(result)


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


PLACEHOLDER = re.compile(r"<[^<>\s]+>|(?<![A-Za-z])[A-Z][A-Z0-9_]*[A-Z](?![a-z])|(?<=[a-z])[A-Z](?![A-Za-z0-9])")


def expand_braces(path: str) -> list[str]:
    """The paths a shell's brace expansion makes of `path`: {a,b} and {0..2}."""
    found = re.search(r"\{([^{}]*)\}", path)
    if not found:
        return [path]
    span = re.fullmatch(r"(\d+)\.\.(\d+)", found.group(1))
    if span:
        width = len(span.group(1))
        choices = [f"{i:0{width}d}" for i in range(int(span.group(1)), int(span.group(2)) + 1)]
    else:
        choices = found.group(1).split(",")
    return [p for choice in choices for p in expand_braces(path[: found.start()] + choice + path[found.end():])]


def project_paths(text: str) -> set[str]:
    """Paths of this repository written in backticks or commands (configs/x.yaml, scripts/y.sh, ...),
    {a,b} patterns expanded and * patterns kept; not COMMIT:path (a file of another commit) nor
    placeholders (PLACEHOLDER)."""
    found = set()
    pattern = rf"(?<![\w./:-])((?:{'|'.join(PROJECT_DIRS)})/[\w./{{}}*<>,-]*[\w}}>*])"
    for written in re.findall(pattern, text):
        found |= {path.rstrip(".") for path in expand_braces(written) if not PLACEHOLDER.search(path)}
    return found


def missing_files(page: Path, text: str) -> list[str]:
    """The project paths in `text` that name no file under the repository's root or beside `page`
    (for a * pattern: that match none)."""
    def exists(path: str) -> bool:
        return any(any(base.glob(path)) if "*" in path else (base / path).exists() for base in (REPO, page.parent))

    return sorted(p for p in project_paths(" ".join(CODE_SPAN.findall(text)) + "\n" + "\n".join(FENCE.findall(text)))
                  if not exists(p))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_project_files_named_exist(page: Path) -> None:
    missing = missing_files(page, page.read_text())
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


OR = "\0"  # `captioner data coco\|flickr8k` in a table cell: the alternatives, each checked


def command_problems(words: list[str], parser: argparse.ArgumentParser | None = None,
                     path: tuple[str, ...] = ()) -> list[str]:
    """What is wrong in the words after `captioner`: a subcommand its parent does not have, or an
    option its command does not have. `captioner data` alone names the group."""
    parser = parser or build_parser()
    choices = subcommands(parser)
    if choices and words and not words[0].startswith("-"):
        if PLACEHOLDER.search(words[0]):
            return []  # captioner COMMAND --help
        wrong = []
        for name in words[0].split(OR):
            if name in choices:
                wrong += command_problems(words[1:], choices[name], (*path, name))
            else:
                wrong.append(f"captioner {' '.join((*path, name))} (no such command)")
        return wrong
    known = {option for action in parser._actions for option in action.option_strings}
    used = [w.split("=", 1)[0] for w in words if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", w)]
    return [f"captioner {' '.join(path)} {option}" for option in used if option not in known]


def command_lines(text: str) -> list[str]:
    lines = []
    for block in FENCE.findall(text):
        joined = block.replace("\\\n", " ")
        lines += [line.strip() for line in joined.splitlines()
                  if re.match(r"\s*(captioner|python -m captioner)\s", line)]
    lines += [span for span in CODE_SPAN.findall(text) if re.match(r"captioner\s+[a-z]", span)]
    return lines


def wrong_commands(text: str) -> list[str]:
    wrong = []
    for line in command_lines(text):
        line = line.replace("\\|", OR).split(" #", 1)[0].split("|", 1)[0].split("&&", 1)[0]
        try:
            words = shlex.split(line.replace("[", " ").replace("]", " "))
        except ValueError:
            continue  # an unbalanced quote in prose: nothing to check
        wrong += command_problems(words[3:] if words[:3] == ["python", "-m", "captioner"] else words[1:])
    return sorted(set(wrong))


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_command_lines_use_commands_and_options_that_exist(page: Path) -> None:
    wrong = wrong_commands(page.read_text())
    assert not wrong, f"{page_id(page)} uses commands or options that do not exist: {wrong}"


def test_the_checks_find_a_misnamed_file_and_a_misspelt_command_and_let_placeholders_be() -> None:
    """The page tests' own check: a path with a capital in it and a subcommand given no option
    are checked like any other, and only what is written as a placeholder is left alone."""
    page = REPO / "README.md"
    wrong = ("Train `configs/Flickr8k_typo.yaml`, then `captioner evalute runs/x/best.pt`; "
             "`configs/shapes_{lstm,transfomer}.yaml`.\n"
             "```bash\ncaptioner data cocoa --root DIR\ncaptioner train configs/shapes_lstm.yaml --epoch 3\n```\n"
             "`scripts/*.ipynb`, `captioner data shapes\\|coco\\|flickr8\\|stats`, `captioner config shwo`")
    assert missing_files(page, wrong) == ["configs/Flickr8k_typo.yaml", "configs/shapes_transfomer.yaml",
                                          "scripts/*.ipynb"]
    assert wrong_commands(wrong) == ["captioner config shwo (no such command)",
                                     "captioner data cocoa (no such command)",
                                     "captioner data flickr8 (no such command)", "captioner evalute (no such command)",
                                     "captioner train --epoch"]
    placeholders = ("`configs/<name>.yaml`, `configs/flickr8k_lstm_liteN.yaml`, `configs/MODEL.yaml`, `captioner "
                    "COMMAND --help`, `configs/shapes_*.yaml`, `configs/shapes_{lstm,transformer}.yaml`, `captioner "
                    "data`, `captioner data coco\\|flickr8k --root DIR`")
    assert missing_files(page, placeholders) == [] and wrong_commands(placeholders) == []


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


# The pages a user reads. docs/experiments.md, docs/benchmarks.md and docs/results.md are the
# records: the commit, date and processor of a measurement belong there, and these pages link to them.
USER_PAGES = [REPO / "README.md", *(REPO / "docs" / f"{name}.md" for name in (
    "install", "training", "coco", "captioning", "evaluation", "demo", "export", "deploy", "library", "encoders",
    "interpretability", "gpu", "reliability", "feature_store", "scst", "input_pipeline", "scst_gpu", "compile_step"))]
# 7 to 40 lower-case hex digits with at least one letter and one digit, standing alone: not a
# colour (#1f77b4, 6 digits and a '#'), a number, a float's exponent (1e10000), a word or a path part.
COMMIT_HASH = r"(?<![\w#/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)(?!\d+e\d+(?![\w/-]))[0-9a-f]{7,40}(?![\w/-])"
MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
DATE = rf"\b(?:19|20)\d\d-[01]\d-(?:[0-3]\d\b|\.\.)|\b{MONTH} [0-3]?\d(?:st|nd|rd|th)?\b|\b[0-3]?\d {MONTH}(?= |$)"
# A user's processor is not ours: CPU and GPU model names, "this machine", the lab's folders.
MACHINE = (r"\bZen ?\d\b|\bEPYC\b|\bXeon\b|\bRyzen\b|\b[AH]100\b|\bH200\b|(?i:\bthis (?:\d+-core "
           r")?(?:machine|VM|processor|CPU)\b)|\.\./shared\b|(?<![\w.])/work/")
NOTEBOOK_MARK = re.compile(f"{COMMIT_HASH}|{DATE}|{MACHINE}")


def notebook_marks(text: str) -> list[str]:
    """What in `text` belongs in a lab notebook, not in a user's guide: commit hashes, dates,
    processor names, "this machine" and `../shared`. Link targets are left out: an anchor of a
    record page may hold a date, and the record pages are where those belong."""
    return sorted(set(NOTEBOOK_MARK.findall(re.sub(r"\]\([^)\s]*\)", "]()", text))))


@pytest.mark.parametrize("page", USER_PAGES, ids=page_id)
def test_user_pages_carry_no_commits_dates_or_machines(page: Path) -> None:
    marks = notebook_marks(page.read_text())
    assert not marks, f"{page_id(page)}: say it for the user, and leave the record to docs/results.md: {marks}"


def test_the_notebook_check_finds_hashes_dates_and_machines_and_lets_numbers_be() -> None:
    notebook = ("latest alone: 17 min 3 s, test BLEU-4 0.932, fac6009, 2026-11-27 evening, slower than d1f0707's 12 "
                "min;\n"
                "`git archive b55abf5 captioner`, on an AMD EPYC Zen 3 and an Intel Xeon, on this machine and this "
                "2-core CPU,\n"
                "a run of 2026-11-.., of Nov 27 and of 3 May 2026, with `../shared/data/flickr8k` and /work/runs/x; an "
                "H200 and an H100.")
    assert notebook_marks(notebook) == ["../shared", "/work/", "2026-11-..", "2026-11-27", "3 May", "EPYC", "H100",
                                        "H200", "Nov 27",
                                        "Xeon", "Zen 3", "b55abf5", "d1f0707", "fac6009", "this 2-core CPU",
                                        "this machine"]
    plain = ("colour #1f77b4 and #ff7f0eaa, 1e100000 steps, 1234567 images, a `deadbeef` word, Xu et al. 2015,\n"
             "March 2015, configs/shapes_lstm.yaml, sha256 prefix `3f2a` and a 224x224 photo, "
             "[the record](results.md#quickstart-2026-11-27-on-an-epyc-zen-3)")
    assert notebook_marks(plain) == []
