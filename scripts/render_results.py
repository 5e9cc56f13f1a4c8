"""Write the results tables of README.md and docs/*.md, and docs/results.md, from the records in
docs/results/*.json (one measure a file: "measure", "about", "columns", "records"), so no table can
drift from what was measured; `--check` exits 1 naming each stale page. A table is a block:

    <!-- results: MEASURE [ids=a,b] [columns=k1,k2] -->  (default: records not superseded, all columns)
    <!-- /results -->
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME = re.compile(r"[a-z0-9_]+")  # measures and ids: they make the anchors of docs/results.md
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
REQUIRED = ("id", "label", "numbers", "command", "commit", "processor", "concurrent", "date")
OPTIONAL = ("note", "superseded_by")
NULLABLE = ("commit", "processor", "concurrent", "date")  # null: not recorded
BLOCK = re.compile(r"^<!-- results: (?P<spec>[^\n]*?) -->\n(?P<body>.*?)^<!-- /results -->$", re.M | re.S)


@dataclass(frozen=True)
class Measure:
    name: str
    about: str
    columns: list[dict[str, str]]
    records: list[dict]
    label_header: str = ""

    def record(self, record_id: str) -> dict | None:
        return next((r for r in self.records if r["id"] == record_id), None)


def results_dir(root: Path) -> Path:
    return root / "docs" / "results"


def results_page(root: Path) -> Path:
    return root / "docs" / "results.md"


def record_problems(where: str, record: object, columns: set[str]) -> list[str]:
    if not isinstance(record, dict):
        return [f"{where}: a record is not an object"]
    where = f"{where}: record {record.get('id')!r}"
    problems = [f"{where}: missing {key!r}" for key in REQUIRED if key not in record]
    problems += [f"{where}: unknown field {key!r}" for key in record if key not in REQUIRED + OPTIONAL]
    if not (isinstance(record.get("id"), str) and NAME.fullmatch(record["id"])):
        problems.append(f"{where}: the id must be lower case letters, digits and _")
    for key in ("label", "command"):
        if key in record and not (isinstance(record[key], str) and record[key].strip()):
            problems.append(f"{where}: {key!r} must be a non-empty string")
    for key in NULLABLE + OPTIONAL:
        if record.get(key) is not None and not isinstance(record[key], str):
            problems.append(f"{where}: {key!r} must be a string or null")
    if isinstance(record.get("date"), str) and not DATE.fullmatch(record["date"]):
        problems.append(f"{where}: the date must be YYYY-MM-DD")
    numbers = record.get("numbers", {})
    if not isinstance(numbers, dict):
        return problems + [f"{where}: 'numbers' must be an object"]
    problems += [f"{where}: number {key!r} is no column of the measure" for key in numbers if key not in columns]
    problems += [f"{where}: number {key!r} must be a number or a string" for key, value in numbers.items()
                 if isinstance(value, bool) or not isinstance(value, (int, float, str))]
    return problems


def measure_problems(where: str, stem: str, data: object) -> list[str]:
    """Every way the contents of one record file break the schema, one line each."""
    if not isinstance(data, dict):
        return [f"{where}: not a JSON object"]
    problems = [f"{where}: missing {key!r}" for key in ("measure", "about", "columns", "records") if key not in data]
    problems += [f"{where}: unknown field {key!r}" for key in data
                 if key not in ("measure", "about", "columns", "records", "label_header")]
    if data.get("measure") != stem:
        problems.append(f"{where}: 'measure' must be the file's stem {stem!r}")
    if not NAME.fullmatch(stem):
        problems.append(f"{where}: the file's stem must be lower case letters, digits and _")
    columns = data.get("columns", [])
    if not isinstance(columns, list) or not all(isinstance(c, dict) and set(c) == {"key", "label"} for c in columns):
        return problems + [f"{where}: 'columns' must be a list of {{\"key\", \"label\"}}"]
    keys = [c["key"] for c in columns]
    problems += [f"{where}: column {key!r} twice" for key in sorted({k for k in keys if keys.count(k) > 1})]
    records = data.get("records", [])
    if not isinstance(records, list):
        return problems + [f"{where}: 'records' must be a list"]
    for record in records:
        problems += record_problems(where, record, set(keys))
    ids = [r.get("id") for r in records if isinstance(r, dict)]
    problems += [f"{where}: record id {i!r} twice"
                 for i in sorted({i for i in ids if ids.count(i) > 1}, key=str)]
    for record in records:
        if isinstance(record, dict) and "superseded_by" in record:
            target = record["superseded_by"]
            if target not in ids or target == record.get("id"):
                problems.append(f"{where}: record {record.get('id')!r}: superseded_by {target!r} "
                                "names no other record")
    return problems


def load(root: Path) -> tuple[dict[str, Measure], list[str]]:
    """Every measure of root's docs/results/, and the problems found in the files."""
    measures, problems = {}, []
    for path in sorted(results_dir(root).glob("*.json")):
        where = path.relative_to(root).as_posix()
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            problems.append(f"{where}: not JSON ({error})")
            continue
        found = measure_problems(where, path.stem, data)
        problems += found
        if not found:
            measures[path.stem] = Measure(path.stem, data["about"], data["columns"], data["records"],
                                          data.get("label_header", ""))
    return measures, problems


def anchor(measure: str, record_id: str) -> str:
    """The anchor of a record's heading in docs/results.md (the heading is this text itself)."""
    return f"{measure}-{record_id}"


def cell(value: object) -> str:
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


def parse_spec(spec: str) -> tuple[str, dict[str, list[str]]]:
    name, *options = spec.split()
    parsed = {}
    for option in options:
        key, _, value = option.partition("=")
        parsed[key] = [v for v in value.split(",") if v]
    return name, parsed


def block_problems(where: str, spec: str, measures: dict[str, Measure]) -> list[str]:
    name, options = parse_spec(spec)
    measure = measures.get(name)
    if measure is None:
        return [f"{where}: block names an unknown measure {name!r}"]
    problems = [f"{where}: block {name}: unknown option {key!r}" for key in options
                if key not in ("ids", "columns")]
    problems += [f"{where}: block {name}: unknown id {i!r}" for i in options.get("ids", [])
                 if measure.record(i) is None]
    keys = {c["key"] for c in measure.columns}
    problems += [f"{where}: block {name}: unknown column {k!r}" for k in options.get("columns", []) if k not in keys]
    return problems


def table(spec: str, measures: dict[str, Measure], page: Path, root: Path) -> str:
    name, options = parse_spec(spec)
    measure = measures[name]
    records = ([measure.record(i) for i in options["ids"]] if "ids" in options
               else [r for r in measure.records if "superseded_by" not in r])
    wanted = options.get("columns")
    columns = [c for c in measure.columns if wanted is None or c["key"] in wanted]
    if wanted:
        columns.sort(key=lambda c: wanted.index(c["key"]))
    link = os.path.relpath(results_page(root), page.parent).replace(os.sep, "/")
    lines = ["| " + " | ".join([measure.label_header] + [c["label"] for c in columns] + ["measured"]) + " |",
             "|---|" + "---:|" * len(columns) + "---|"]
    for record in records:
        numbers = [cell(record["numbers"].get(c["key"])) for c in columns]
        lines.append("| " + " | ".join([cell(record["label"]), *numbers,
                                        f"[how]({link}#{anchor(name, record['id'])})"]) + " |")
    return "\n".join(lines)


def pages(root: Path) -> list[Path]:
    """The pages that may hold results blocks: the README and docs/*.md, not the generated page."""
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))]
            if p.exists() and p != results_page(root)]


def rendered_page(page: Path, measures: dict[str, Measure], root: Path) -> str:
    def fill(match: re.Match) -> str:
        spec = match.group("spec")
        return f"<!-- results: {spec} -->\n{table(spec, measures, page, root)}\n<!-- /results -->"

    return BLOCK.sub(fill, page.read_text())


def record_section(measure: Measure, record: dict) -> list[str]:
    out = [f"### {anchor(measure.name, record['id'])}", "", record["label"]]
    if "superseded_by" in record:
        out[-1] += f" (superseded by [{record['superseded_by']}](#{anchor(measure.name, record['superseded_by'])}))"
    labels = {c["key"]: c["label"] for c in measure.columns}
    numbers = "; ".join(f"{labels[k]} {cell(record['numbers'][k])}" for k in labels if k in record["numbers"])
    not_recorded = "not recorded"
    out += ["", f"- numbers: {numbers or 'none'}",
            f"- commit: {record['commit'] or not_recorded}",
            f"- processor: {record['processor'] or not_recorded}",
            f"- what else ran: {record['concurrent'] or not_recorded}",
            f"- date: {record['date'] or not_recorded}"]
    if record.get("note"):
        out.append(f"- note: {record['note']}")
    # Indented, not fenced: a command is kept as it ran at its commit, and the docs check reads
    # fenced commands against the current tree.
    out += ["", *("    " + line for line in record["command"].splitlines()), ""]
    return out


def results_markdown(measures: dict[str, Measure]) -> str:
    out = ["# Results: every record", "",
           "Written by `python scripts/render_results.py` from `docs/results/*.json` (a test fails when it is",
           "stale): every measurement behind the tables of the README and the docs, superseded ones included,",
           "with the command that made it, the commit, the processor, what else ran and the date.", "",
           "Measures: " + ", ".join(f"[{name}](#{name})" for name in measures) + ".", ""]
    for measure in measures.values():
        out += [f"## {measure.name}", "", measure.about, ""]
        for record in measure.records:
            out += record_section(measure, record)
    return "\n".join(out)


def check(root: Path) -> tuple[dict[Path, str], list[str]]:
    """The pages as they should read, and the problems that stop them being written."""
    measures, problems = load(root)
    for page in pages(root):
        for match in BLOCK.finditer(page.read_text()):
            problems += block_problems(page.relative_to(root).as_posix(), match.group("spec"), measures)
    if problems:
        return {}, problems
    wanted = {page: rendered_page(page, measures, root) for page in pages(root)}
    wanted[results_page(root)] = results_markdown(measures)
    return wanted, []


def stale(wanted: dict[Path, str]) -> list[Path]:
    return [page for page, text in wanted.items() if not page.exists() or page.read_text() != text]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report the stale pages; change nothing")
    args = parser.parse_args()
    wanted, problems = check(REPO)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    outdated = stale(wanted)
    if args.check:
        for page in outdated:
            print(f"{page.relative_to(REPO)} is stale: run python scripts/render_results.py", file=sys.stderr)
        return 1 if outdated else 0
    for page in outdated:
        page.write_text(wanted[page])
        print(f"wrote {page.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
