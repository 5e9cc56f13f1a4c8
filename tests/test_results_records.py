"""The results tables of README.md and docs/*.md, and docs/results.md, are what
scripts/render_results.py writes from the records in docs/results/*.json, and every record keeps
the schema: a table edited by hand, a record without its command, a duplicate id, a
superseded_by that points nowhere or a block naming what no record has fails here."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import REPO, render_results

render = render_results()


def test_the_records_are_valid_and_the_pages_are_theirs() -> None:
    wanted, problems = render.check(REPO)
    assert not problems, "\n".join(problems)
    stale = [page.relative_to(REPO).as_posix() for page in render.stale(wanted)]
    assert not stale, f"stale: {stale}: run python scripts/render_results.py"


MEASURE = {
    "measure": "toy",
    "about": "A toy measure.",
    "columns": [{"key": "bleu4", "label": "BLEU-4"}, {"key": "cider", "label": "CIDEr-D"}],
    "records": [
        {"id": "new", "label": "the new run", "numbers": {"bleu4": 21.9, "cider": "0.540"},
         "command": "captioner evaluate a.pt",
         "commit": "abc1234", "processor": "some CPU", "concurrent": "nothing", "date": "2026-01-02"},
        {"id": "old", "label": "the old run", "numbers": {"bleu4": 20.1}, "command": "captioner evaluate b.pt",
         "commit": None, "processor": None, "concurrent": None, "date": None, "superseded_by": "new"},
    ],
}
BLOCK = "<!-- results: toy -->\n<!-- /results -->\n"


def toy_repo(root: Path, measure: dict, block: str = BLOCK) -> Path:
    (root / "docs" / "results").mkdir(parents=True)
    (root / "docs" / "results" / "toy.json").write_text(json.dumps(measure))
    (root / "README.md").write_text(f"# Toy\n\n{block}\nafter the table\n")
    return root


def written(root: Path) -> None:
    wanted, problems = render.check(root)
    assert not problems
    for page in render.stale(wanted):
        page.write_text(wanted[page])


def test_a_table_shows_the_current_records_and_links_each_to_its_full_record(tmp_path: Path) -> None:
    root = toy_repo(tmp_path, MEASURE, "<!-- results: toy columns=cider,bleu4 -->\n<!-- /results -->\n")
    written(root)
    readme = (root / "README.md").read_text()
    assert "| the new run | 0.540 | 21.9 | [how](docs/results.md#toy-new) |" in readme
    assert "the old run" not in readme and "abc1234" not in readme and readme.endswith("after the table\n")
    page = (root / "docs" / "results.md").read_text()
    assert "### toy-new" in page and "### toy-old" in page and "superseded by [new](#toy-new)" in page
    assert "abc1234" in page and "captioner evaluate b.pt" in page and "commit: not recorded" in page
    assert render.stale(render.check(root)[0]) == []


def test_a_table_edited_by_hand_is_stale(tmp_path: Path) -> None:
    root = toy_repo(tmp_path, MEASURE)
    written(root)
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("21.9", "23.0"))
    assert render.stale(render.check(root)[0]) == [readme]


def without_command(m: dict) -> None:
    del m["records"][0]["command"]


def twice(m: dict) -> None:
    m["records"][1]["id"] = "new"
    del m["records"][1]["superseded_by"]


def superseded_by_nothing(m: dict) -> None:
    m["records"][1]["superseded_by"] = "newest"


def unknown_number(m: dict) -> None:
    m["records"][0]["numbers"]["meteor"] = 20.8


def bad_date(m: dict) -> None:
    m["records"][0]["date"] = "28 November"


def other_stem(m: dict) -> None:
    m["measure"] = "toys"


@pytest.mark.parametrize("break_it, message", [
    (without_command, "docs/results/toy.json: record 'new': missing 'command'"),
    (twice, "docs/results/toy.json: record id 'new' twice"),
    (superseded_by_nothing, "docs/results/toy.json: record 'old': superseded_by 'newest' names no other record"),
    (unknown_number, "docs/results/toy.json: record 'new': number 'meteor' is no column of the measure"),
    (bad_date, "docs/results/toy.json: record 'new': the date must be YYYY-MM-DD"),
    (other_stem, "docs/results/toy.json: 'measure' must be the file's stem 'toy'"),
], ids=lambda x: getattr(x, "__name__", "message"))
def test_a_malformed_record_is_named_by_file_and_record(tmp_path: Path, break_it: Callable[[dict], None],
                                                        message: str) -> None:
    measure = copy.deepcopy(MEASURE)
    break_it(measure)
    wanted, problems = render.check(toy_repo(tmp_path, measure))
    assert message in problems and wanted == {}


@pytest.mark.parametrize("block, message", [
    ("<!-- results: toyz -->", "README.md: block names an unknown measure 'toyz'"),
    ("<!-- results: toy ids=new,newest -->", "README.md: block toy: unknown id 'newest'"),
    ("<!-- results: toy columns=bleu4,meteor -->", "README.md: block toy: unknown column 'meteor'"),
    ("<!-- results: toy rows=new -->", "README.md: block toy: unknown option 'rows'"),
])
def test_a_block_naming_what_no_record_has_is_named(tmp_path: Path, block: str, message: str) -> None:
    wanted, problems = render.check(toy_repo(tmp_path, MEASURE, f"{block}\n<!-- /results -->\n"))
    assert problems == [message] and wanted == {}


def test_the_command_line_checks_and_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(render, "REPO", toy_repo(tmp_path, MEASURE))
    monkeypatch.setattr("sys.argv", ["render_results.py", "--check"])
    assert render.main() == 1 and "README.md is stale" in capsys.readouterr().err
    monkeypatch.setattr("sys.argv", ["render_results.py"])
    assert render.main() == 0
    monkeypatch.setattr("sys.argv", ["render_results.py", "--check"])
    assert render.main() == 0
