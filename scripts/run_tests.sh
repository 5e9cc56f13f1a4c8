#!/usr/bin/env bash
# Set up a fresh machine, check the import contracts and run the test suite (CPU, a few minutes).
# -rs prints why each skipped test skipped. The script's exit status is pytest's own, whatever
# it is: a failure (1), or an interpreter that aborts at exit after green tests (134), is never
# swallowed. Under CI=true a test whose Java, ../shared/data or Chromium is missing fails.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
# The web page's tests need onnxruntime-web, pinned by package-lock.json, in node_modules/ (npm's registry).
# npm ci reads nothing of Python's, so it runs beside the Python install (both mostly wait on files and the
# registry) and pytest waits for it.
npm_pid=
if command -v npm >/dev/null; then
    npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null &
    npm_pid=$!
fi
EXTRAS=test source scripts/setup.sh  # test = train, demo, onnx and the test tools
# The tests' own modules too (setup.sh compiled the package's): the suite's hundreds of child
# processes then read bytecode even where Python may not write it (PYTHONDONTWRITEBYTECODE).
python -m compileall -q -j 0 tests scripts benchmarks >/dev/null
# The layers and the no-cycle rule of pyproject.toml's import-linter contracts.
lint-imports --no-cache || { status=$?; echo "run_tests.sh: the import contracts are broken (above)" >&2; }
# No line of the project's Python over 120 characters, no unused import or variable, no undefined name
# (pyproject.toml's [tool.ruff]).
ruff check . || { status=$?; echo "run_tests.sh: ruff found lines over 120 characters or unused names (above)" >&2; }
if [ -n "$npm_pid" ]; then
    wait "$npm_pid" || { status=$?; echo "run_tests.sh: npm ci failed" >&2; }
fi
# -n: one pytest worker per core (pytest-xdist); PYTEST_WORKERS=0 runs in this process alone.
# loadgroup: the tests of an xdist_group share a worker (and its module fixtures).
# --durations: every run names its slowest tests, where the suite's time goes (docs/benchmarks.md).
python -m pytest -q -rs -n "${PYTEST_WORKERS:-$(nproc)}" --dist loadgroup --durations=25 "$@" \
    || { status=$?; echo "run_tests.sh: pytest exited with status $status" >&2; }
exit "$status"
