"""Run `SCRIPT --help` for many scripts in ONE fresh interpreter, as `python SCRIPT --help` would
run each: `__main__` is the script, its folder is first on sys.path, the working folder is an
empty one of its own. What each printed, its exit code and the files it left are written as JSON.

    python tests/help_runner.py OUT.json WORK_DIR SCRIPT [SCRIPT ...]

One interpreter imports torch once instead of once per script (several seconds each on two
cores); between scripts, sys.path, sys.argv, the working folder and the modules of the script
folders are put back, so one script's imports cannot stand in for another's.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
import traceback
from pathlib import Path


def run_help(script: Path, work: Path) -> dict[str, object]:
    folder = str(script.parent)
    saved_path, saved_argv, saved_cwd = list(sys.path), list(sys.argv), os.getcwd()
    before = set(sys.modules)
    stdout, stderr = io.StringIO(), io.StringIO()
    code: object = 0
    work.mkdir(parents=True)
    try:
        sys.path.insert(0, folder)
        sys.argv = [str(script), "--help"]
        os.chdir(work)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as e:
                code = e.code if e.code is not None else 0
            except BaseException:
                traceback.print_exc()
                code = "raised"
    finally:
        os.chdir(saved_cwd)
        sys.path[:], sys.argv[:] = saved_path, saved_argv
        for name in set(sys.modules) - before:  # the scripts' own sibling modules (bench_metrics, ...)
            module_file = getattr(sys.modules[name], "__file__", None) or ""
            if Path(module_file).resolve().parent == script.parent:
                del sys.modules[name]
    return {"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue(),
            "files": sorted(p.name for p in work.iterdir())}


def main() -> None:
    out, work = Path(sys.argv[1]), Path(sys.argv[2])
    results = {}
    for n, script in enumerate(sys.argv[3:]):
        results[script] = run_help(Path(script).resolve(), work / f"run_{n}")
    out.write_text(json.dumps(results), encoding="utf-8")


if __name__ == "__main__":
    main()
