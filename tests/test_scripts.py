"""Every script in scripts/, benchmarks/ and demo/ starts, parses its arguments and explains
itself: `--help` exits 0 with a usage line, so a script broken by a moved or renamed module
fails here instead of in a user's hands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p.relative_to(ROOT) for folder in ("scripts", "benchmarks", "demo") for p in (ROOT / folder).glob("*.py"))
SCRIPTS = [p for p in FILES if '__name__ == "__main__"' in (ROOT / p).read_text()]
SUPPORT = [p for p in FILES if p not in SCRIPTS]  # modules the scripts share (the reference's loader)


def test_the_scripts_are_found() -> None:
    assert {"benchmarks/bench_gpu.py", "scripts/plot_runs.py", "demo/app.py"} <= {str(p) for p in SCRIPTS}


@pytest.mark.parametrize("module", SUPPORT, ids=str)
def test_every_support_module_is_used_by_a_script(module: Path) -> None:
    users = [p for p in SCRIPTS if p.parent == module.parent and f"{module.stem}" in (ROOT / p).read_text()]
    assert users, f"{module}: no script imports it (dead code, or a script without a __main__ guard)"


@pytest.fixture(scope="module")
def helps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every script's `--help`, run in one fresh interpreter (tests/help_runner.py) rather than
    one each: the same checks, without importing torch 30 times."""
    folder = tmp_path_factory.mktemp("helps")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "help_runner.py"), str(folder / "helps.json"), str(folder / "work"),
         *(str(ROOT / p) for p in SCRIPTS)],
        cwd=folder, capture_output=True, text=True, env=env, timeout=600,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return json.loads((folder / "helps.json").read_text(encoding="utf-8"))


@pytest.mark.xdist_group("script_helps")  # one worker runs the runner once for all of them
@pytest.mark.parametrize("script", SCRIPTS, ids=str)
def test_help(script: Path, helps: dict[str, dict]) -> None:
    result = helps[str(ROOT / script)]
    assert result["code"] == 0, (result["stdout"] + result["stderr"])[-2000:]
    assert "usage:" in result["stdout"].lower(), result["stdout"][-1000:]
    assert result["files"] == []  # --help writes nothing


def test_the_help_runner_reports_a_script_that_fails_to_import(tmp_path: Path) -> None:
    """A script broken by a moved module must fail its test, not pass on another script's imports."""
    broken = tmp_path / "broken.py"
    broken.write_text('import argparse\nfrom captioner.no_such_module import x\nif __name__ == "__main__":\n'
                      '    argparse.ArgumentParser().parse_args()\n', encoding="utf-8")
    writer = tmp_path / "writer.py"
    writer.write_text('import argparse\nif __name__ == "__main__":\n    open("left.txt", "w").close()\n'
                      '    argparse.ArgumentParser().parse_args()\n', encoding="utf-8")
    subprocess.run([sys.executable, str(ROOT / "tests" / "help_runner.py"), str(tmp_path / "out.json"), str(tmp_path / "work"),
                    str(broken), str(writer)], check=True, cwd=tmp_path, timeout=300)
    results = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    assert results[str(broken)]["code"] == "raised" and "No module named 'captioner.no_such_module'" in results[str(broken)]["stderr"]
    assert results[str(writer)]["code"] == 0 and results[str(writer)]["files"] == ["left.txt"]
