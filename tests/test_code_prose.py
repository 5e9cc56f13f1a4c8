"""The comments and docstrings of the code speak of the code: no dates, issue numbers, commit hashes
or anecdotes of the machine a number was measured on. Such history belongs in the commit log and in
docs/results/, where each measurement is a record with its command, processor and date; a comment
that needs a measured number names the benchmark that shows it.

Only comments (read with tokenize) and docstrings (read with ast) are scanned, so string data such as
checksums and test vectors is not mistaken for prose."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from helpers import REPO

FOLDERS = ("captioner", "tests", "benchmarks", "demo", "scripts")
# The docs' check of prose names what it looks for, in its comments as in its patterns.
NAME_THE_PATTERNS = ("tests/test_docs_hold.py",)

MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
# Each pattern names what it finds, for the failure message.
PATTERNS = {
    # An ISO date, a month and its day, or a month named in full (but "March" and "May", verbs too).
    "date": re.compile(
        rf"\b20\d\d-[01]\d-[0-3]\d\b|\b{MONTH} [0-3]?\d\b|\b[0-3]?\d {MONTH}(?= |$)"
        r"|\b(?:January|February|April|June|July|August|September|October|November|December)\b"
    ),
    # A project's issue or pull request by its number, in words or after a hash; another project's
    # ("pytorch/pytorch#1234") is a reference a maintainer follows, not history.
    "issue number": re.compile(r"\b(?:issue|pr|pull request)s?\s*#?\d+|(?<![\w/&])#\d+\b", re.I),
    # 7 to 12 hex digits with both a digit and a letter a-f, standing alone: what `git log --oneline`
    # prints. Not a 0x constant, a longer digest or a float's exponent (1e10000).
    "commit hash": re.compile(
        r"(?<![\w.#/-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])(?!\d+e\d+(?![\w.]))[0-9a-f]{7,12}(?![\w./-])"
    ),
    "machine anecdote": re.compile(
        r"\bZen ?\d\b|\bEPYC\b|\bXeon\b|\bRyzen\b|\bthis machine\b|\bon our\b|\b\d+-core machine\b|\b[AH]100\b|\bH200\b"
        r"|\bGPU session\b|\bmeasured here\b|\bwas red\b|\bCI runs?\b",
        re.I,
    ),
}


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring in `source`; a docstring is one entry per line."""
    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                doc = body[0].value
                if isinstance(doc.value, str):
                    found += [(doc.lineno + n, line) for n, line in enumerate(doc.value.splitlines())]
    return sorted(found)


def history_marks(source: str) -> list[tuple[int, str, str]]:
    """(line, what, text) of each comment or docstring line that speaks of history, not of the code."""
    return [
        (line, what, text.strip())
        for line, text in prose(source)
        for what, pattern in PATTERNS.items()
        if pattern.search(text)
    ]


def python_files() -> list[Path]:
    return sorted(
        path for folder in FOLDERS for path in (REPO / folder).rglob("*.py")
        if path.relative_to(REPO).as_posix() not in NAME_THE_PATTERNS
    )


def test_the_code_speaks_of_the_code() -> None:
    marks = [
        f"{path.relative_to(REPO)}:{line}: {what}: {text}"
        for path in python_files()
        for line, what, text in history_marks(path.read_text())
    ]
    assert not marks, "comments and docstrings that speak of history, not of the code:\n" + "\n".join(marks)


@pytest.mark.parametrize(
    ("comment", "what"),
    [
        ("# Shared by both scorers (issue 21: the tables were loaded twice).", "issue number"),
        ("# See #51 for the discussion.", "issue number"),
        ("# Measured on 2026-11-27: 82 s an epoch.", "date"),
        ("# The evening run of Nov 27 was slower.", "date"),
        ("# Since fac6009 the step is graphed.", "commit hash"),
        ("# 4 workers: fastest on the Zen 3 (2 cores).", "machine anecdote"),
        ("# On this machine the bf16 step is slower.", "machine anecdote"),
        ("# The H100 session showed a 2x speed-up.", "machine anecdote"),
    ],
)
def test_each_kind_of_history_is_found(comment: str, what: str) -> None:
    source = f"x = 1\n{comment}\ny = 2\n"
    assert [(line, found) for line, found, _ in history_marks(source)] == [(2, what)]


def test_docstrings_are_read_and_string_data_is_not() -> None:
    source = (
        'def f():\n'
        '    """Tuned on the Zen 4 in\n'
        '    November."""\n'
        '    return "deadbeef12 issue 21 2026-11-27"\n'
        'DIGEST = "0a1b2c3d4e"  # sha256 prefix of the file, 0x1f2e3d4c, overflows past 1e10000\n'
    )
    assert [(line, what) for line, what, _ in history_marks(source)] == [
        (2, "machine anecdote"),
        (3, "date"),
    ]


def test_what_the_code_says_of_itself_passes() -> None:
    source = (
        '"""Beam search over the decoder\'s step; see pytorch/pytorch#1234 for why the mask is\n'
        'float. CUDA\'s autocast keeps index_copy in the input dtype, so the scores are cast first."""\n'
        "# 4 workers: the fastest setting in `python -m benchmarks loader` (docs/benchmarks.md#loader).\n"
        "# Issue the reads in the order of the files on disk.\n"
        "COLOUR = '#1f77b4'  # matplotlib's first colour\n"
    )
    assert history_marks(source) == []


def test_a_tuned_constant_names_its_benchmark_not_the_machine_or_the_issue() -> None:
    def source(provenance: str) -> str:
        return (
            "def default_processes(num_images: int) -> int:\n"
            '    """One METEOR process per free core, at most one per 5,000 images.\n'
            f"    {provenance}\n"
            '    (29 s over val2014, against 35 s with one)."""\n'
        )

    history = source("On an idle 2-core machine that is two; docs/benchmarks.md, issue 21")
    assert {(line, what) for line, what, _ in history_marks(history)} == {(3, "machine anecdote"), (3, "issue number")}
    assert history_marks(source("With two idle cores that is two (`python -m benchmarks metrics`)")) == []
