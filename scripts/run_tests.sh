#!/usr/bin/env bash
# Set up a fresh machine and run the test suite (CPU, a few minutes).
# -rs prints why each skipped test skipped. The script's exit status is pytest's own, whatever
# it is: a failure (1), or an interpreter that aborts at exit after green tests (134), is never
# swallowed. Under CI=true a test whose Java, ../shared/data or Chromium is missing fails.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=demo,test source scripts/setup.sh
status=0
python -m pytest -q -rs "$@" || status=$?
if [ "$status" -ne 0 ]; then
    echo "run_tests.sh: pytest exited with status $status" >&2
fi
exit "$status"
