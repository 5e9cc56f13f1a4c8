"""Write the module tables of docs/architecture.md from the code: each layer's package docstring,
each module's line count and the first sentence of its docstring, so the page cannot go stale.

    python scripts/architecture_table.py           # rewrite the "## Modules" section
    python scripts/architecture_table.py --check   # exit 1 when the page differs (tests/test_docs_hold.py)
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "architecture.md"
LAYERS = ("core", "text", "data", "models", "deploy", "evaluation", "training", "viz", "apps")  # bottom to top, as the contract
HEADING = "## Modules"
ABBREVIATIONS = ("et al.", "e.g.", "i.e.", "vs.")


def first_sentence(docstring: str | None) -> str:
    """The docstring's first sentence, on one line, without its final period (a period ends a
    sentence when a space or the end follows, and it ends no abbreviation)."""
    text = " ".join((docstring or "").split())
    masked = text
    for abbreviation in ABBREVIATIONS:
        masked = masked.replace(abbreviation, abbreviation.replace(".", "\0"))
    end = re.search(r"\.(?=\s|$)", masked)
    sentence = text[: end.start()] if end else text
    return sentence.replace("|", "\\|")


def docstring(path: Path) -> str | None:
    return ast.get_docstring(ast.parse(path.read_text()))


def module_rows(package: Path) -> list[tuple[str, int, str]]:
    """(dotted name below the layer, lines, job) of every module of a layer, sub-packages included."""
    rows = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).with_suffix("")
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        if not parts:
            continue  # the layer's own __init__: its docstring heads the table
        lines = len(path.read_text().splitlines())
        rows.append((".".join(parts), lines, first_sentence(docstring(path))))
    return sorted(rows)


def section() -> str:
    out = [HEADING, "", "Written by `python scripts/architecture_table.py` from the code (a test fails when it is stale):",
           "each module's line count and the first sentence of its docstring.", ""]
    for layer in LAYERS:
        package = REPO / "captioner" / layer
        out += [f"**{layer}/** ({first_sentence(docstring(package / '__init__.py'))})", "", "| module | lines | job |", "|---|---:|---|"]
        out += [f"| `{name}` | {lines} | {job} |" for name, lines, job in module_rows(package)]
        out.append("")
    return "\n".join(out)


def rewritten(page: str) -> str:
    start = page.index(HEADING)  # the section runs to the end of the page
    return page[:start] + section()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report whether the page is current; change nothing")
    args = parser.parse_args()
    page = PAGE.read_text()
    new = rewritten(page)
    if args.check:
        if new != page:
            print(f"{PAGE} is stale: run python scripts/architecture_table.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    print(f"wrote the module tables of {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
