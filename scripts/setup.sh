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
# Without an NVIDIA GPU they come from PyTorch's CPU-only index (scripts/torch_index.sh; TORCH_INDEX
# chooses); where that index cannot be reached, from the default one, with a line saying so.
TORCH=("torch==2.14.1" "torchvision==0.29.1")
index=$(bash "$(dirname "${BASH_SOURCE[0]}")/torch_index.sh")
if [ -z "$index" ]; then
    python -m pip install --quiet "${TORCH[@]}"
elif ! python -m pip install --quiet --retries 1 --timeout 20 --index-url "$index" "${TORCH[@]}" 2>/dev/null; then
    echo "setup.sh: cannot install torch from $index; installing it from the default index instead (on Linux it brings the CUDA libraries)" >&2
    python -m pip install --quiet "${TORCH[@]}"
fi
EXTRAS=${EXTRAS-train,demo}
python -m pip install --quiet -e ".${EXTRAS:+[$EXTRAS]}"
