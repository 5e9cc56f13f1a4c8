#!/usr/bin/env bash
# Set up a fresh machine and run the test suite (CPU, a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=demo,test source scripts/setup.sh
python -m pytest -q "$@"
