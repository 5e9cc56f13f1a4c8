"""The `captioner` command's exit: both ways in (`python -m captioner`, the installed script) go through
apps/cli.command_line, which freezes the process's objects once `main` has returned, raised or exited, so
that the interpreter's exit does not collect torch's objects again (benchmarks/bench_packaged_model.py)."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest
from helpers import REPO, exits_frozen, subprocess_env

from captioner.apps import cli


def test_the_installed_script_is_command_line() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["captioner"] == "captioner.apps.cli:command_line"


@pytest.mark.parametrize(("argv", "status"), [(["--help"], 0), (["caption"], 2), (["nonsense"], 2)])
def test_python_m_captioner_exits_frozen_with_mains_status(argv: list[str], status: int) -> None:
    """--help and an argparse refusal leave through SystemExit, not a return: frozen all the same."""
    done = subprocess.run([sys.executable, "-c", exits_frozen("captioner"), *argv], env=subprocess_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == status, done.stderr
    assert done.stderr.endswith("frozen 1")


@pytest.mark.parametrize("ending", ["returns", "raises"])
def test_command_line_freezes_after_main(monkeypatch: pytest.MonkeyPatch, ending: str) -> None:
    calls: list[str] = []

    def main(argv: list[str] | None = None) -> int:
        calls.append(f"main {argv}")
        if ending == "raises":
            raise RuntimeError("a bug")
        return 3

    monkeypatch.setattr(cli, "main", main)
    monkeypatch.setattr(cli.gc, "freeze", lambda: calls.append("freeze"))
    if ending == "raises":
        with pytest.raises(RuntimeError, match="a bug"):
            cli.command_line(["x"])
    else:
        assert cli.command_line(["x"]) == 3
    assert calls == ["main ['x']", "freeze"]
