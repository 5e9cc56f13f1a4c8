#!/usr/bin/env bash
# Create .venv (if missing), install captioner and its dependencies into it, and activate it.
# Sourced by quickstart.sh and run_tests.sh. EXTRAS picks the extras (docs/install.md): by
# default train and demo, everything the README uses; EXTRAS=test adds ONNX and the test tools,
# EXTRAS= installs the captioning core alone.
set -euo pipefail
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
source .venv/bin/activate
python -m pip install --quiet --upgrade pip
# torch/torchvision pinned to the versions this project is tested with; any CUDA or CPU build works.
python -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
EXTRAS=${EXTRAS-train,demo}
python -m pip install --quiet -e ".${EXTRAS:+[$EXTRAS]}"
