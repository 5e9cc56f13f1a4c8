"""No line of the project's code over 120 characters: its Python, shell, configs, web page and build files.
ruff checks the Python but leaves out a line's trailing pragma (`# noqa: E402`) and every other language;
this counts every character of every line, as a reader's window shows it."""

from __future__ import annotations

from pathlib import Path

from helpers import REPO

LIMIT = 120
SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".js", ".mjs", ".html", ".css", ".cfg"}
FOLDERS = ("captioner", "tests", "benchmarks", "demo", "scripts", "configs", "runtime", "examples", ".ci")
SKIPPED = {"node_modules", "__pycache__", "build", ".venv"}  # installed or built, not written here
# The web page's Content-Security-Policy is one attribute, and CSP's grammar allows spaces and tabs between
# its directives, not line breaks: the one kind of line that may be longer.
UNBROKEN = ('content="default-src ',)


def code_files() -> list[Path]:
    files = [REPO / "pyproject.toml", REPO / ".ci" / "run"]
    for folder in FOLDERS:
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix in SUFFIXES and path.is_file() and not SKIPPED & set(path.relative_to(REPO).parts):
                files.append(path)
    return files


def long_lines(path: Path, root: Path = REPO) -> list[str]:
    """'file:line (N characters)' of each line of `path` longer than LIMIT, the file named from `root`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [f"{path.relative_to(root)}:{number} ({len(line)} characters)"
            for number, line in enumerate(lines, 1)
            if len(line) > LIMIT and not any(line.lstrip().startswith(start) for start in UNBROKEN)]


def test_the_scan_finds_the_kinds_of_code_the_project_has() -> None:
    kinds = {path.suffix or path.name for path in code_files()}
    assert {".py", ".sh", ".yaml", ".toml", ".js", ".mjs", "run"} <= kinds  # a scan that lost a kind fails here


def test_no_line_of_code_is_over_120_characters() -> None:
    found = [line for path in code_files() for line in long_lines(path)]
    assert not found, "lines over 120 characters:\n" + "\n".join(found)


def test_a_long_line_is_named_with_its_file_and_length(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("echo short\n" + "x" * 121 + "\n" + "é" * 120 + "\n" + ' content="default-src ' + "x" * 120,
                      encoding="utf-8")
    assert long_lines(script, tmp_path) == ["run.sh:2 (121 characters)"]  # characters, not bytes
