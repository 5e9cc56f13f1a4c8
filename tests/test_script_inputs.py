"""The command-line contract of the scripts in scripts/: a user's mistake (a missing file, a folder where a file is
expected or the reverse, a file that is empty, not UTF-8, not JSON or JSON of another shape, an option value that
means nothing, an output that cannot be written) is one `error:` line on stderr naming the file or option, exit
status 2, no traceback, and an output file that was there is left as it was. Each script runs in this process
through its `main(argv)` where it has one, cheap cases only: nothing trains or decodes a split."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def script(name: str) -> ModuleType:
    """scripts/<name>.py as a module (not run as __main__), loaded once."""
    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refusal(capsys: pytest.CaptureFixture[str], name: str, argv: list[str], status: int = 2) -> str:
    """The one line scripts/<name>.py's main(argv) refuses `argv` with (exit `status`, nothing on stdout)."""
    try:
        code = script(name).main(argv)
    except SystemExit as stop:  # argparse's refusal
        code = stop.code
    out, err = capsys.readouterr()
    assert code == status, (code, out, err)
    assert out == "" and "Traceback" not in err and err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


# Files that are no scores file, by what is wrong with them, and the words of their refusal.
NOT_SCORES = {
    "empty": (b"", "not valid JSON"),
    "truncated": (b'{"overall": {', "not valid JSON"),
    "not UTF-8": (b"\xff\xfe{}", "not UTF-8"),
    "a list": (b"[1, 2]", "not a scores file (a JSON list"),
}
OFFICIAL = dict.fromkeys(("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr"), 0.5)


# --- results_table.py ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", NOT_SCORES)
def test_results_table_names_a_scores_file_it_cannot_read(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                          kind: str) -> None:
    content, says = NOT_SCORES[kind]
    write(tmp_path / "run" / "scores_test.json", content)
    assert says in refusal(capsys, "results_table", [str(tmp_path / "run")])


@pytest.mark.parametrize("report, says", [
    ({"overall": {**OFFICIAL, "CIDEr": "high"}}, "overall: CIDEr is 'high', not a number"),
    ({"overall": OFFICIAL, "grounding": {"words": 3}}, "grounding: no 'score'"),
    ({"overall": OFFICIAL, "caption_stats": [0.1]}, "caption_stats: expected an object of scores, found a JSON list"),
], ids=["a word for a score", "grounding without its score", "statistics not an object"])
def test_results_table_names_the_field_of_a_scores_file_of_another_shape(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, report: dict, says: str) -> None:
    write(tmp_path / "run" / "scores_test.json", json.dumps(report))
    assert refusal(capsys, "results_table", [str(tmp_path / "run")]) == (
        f"error: {tmp_path / 'run' / 'scores_test.json'}: {says}")


def test_results_table_says_a_file_is_no_run_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    scores = write(tmp_path / "scores_test.json", json.dumps({"overall": OFFICIAL}))
    assert refusal(capsys, "results_table", [str(scores)]) == (
        f"error: {scores}: a file, not a run folder (give the folder that holds scores_test.json)")


def test_results_table_prints_a_score_that_was_not_finite_as_a_dash(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    write(tmp_path / "run" / "scores_test.json", json.dumps({"overall": {**OFFICIAL, "METEOR": None}}))
    assert script("results_table").main([str(tmp_path / "run")]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert row == "| run | - | - | " + "0.500 | " * 4 + "- | 0.500 | 0.500 | - | - | - |"
