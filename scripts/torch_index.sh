#!/usr/bin/env bash
# Print the package index that scripts/setup.sh installs PyTorch from: PyTorch's CPU-only wheels
# where this machine has no NVIDIA GPU (torch without the CUDA libraries: a fraction of the
# download), else nothing (the default index, whose Linux torch brings CUDA).
# TORCH_INDEX chooses instead: cpu, cuda (the default index), or an index URL of your own.
set -euo pipefail
CPU_INDEX=https://download.pytorch.org/whl/cpu
choice=${TORCH_INDEX:-auto}
if [ "$choice" = auto ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then choice=cuda; else choice=cpu; fi
fi
case $choice in
    cpu) echo "$CPU_INDEX" ;;
    cuda|default) echo "" ;;
    http://*|https://*|file://*) echo "$choice" ;;
    *) echo "scripts/torch_index.sh: TORCH_INDEX=$choice: use auto, cpu, cuda or an index URL" >&2; exit 2 ;;
esac
