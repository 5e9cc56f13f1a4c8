"""Every script in scripts/, benchmarks/ and demo/ starts, parses its arguments and explains
itself: `--help` exits 0 with a usage line, so a script broken by a moved or renamed module
fails here instead of in a user's hands."""

from __future__ import annotations

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


@pytest.mark.parametrize("script", SCRIPTS, ids=str)
def test_help(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, str(ROOT / script), "--help"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]
    assert "usage:" in result.stdout.lower(), result.stdout[-1000:]
    assert list(tmp_path.iterdir()) == []  # --help writes nothing
