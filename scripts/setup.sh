#!/usr/bin/env bash
# Create .venv (if missing), install captioner and its dependencies into it, and activate it.
# Sourced by quickstart.sh and run_tests.sh. EXTRAS picks the extras (docs/install.md): by
# default train and demo, everything the README uses; EXTRAS=test adds ONNX and the test tools,
# EXTRAS= installs the captioning core alone.
# The packages are installed by uv, pip's faster stand-in (parallel downloads and unpacking:
# everything the tests use in 47 s here against about 2 minutes with pip, cold caches), and by pip
# where uv cannot be installed or fails, or when INSTALLER=pip asks for it. uv does not read pip's
# configuration files; an index set in the environment (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL,
# PIP_FIND_LINKS) is passed on to it, and anything uv cannot install is tried again with pip.
set -euo pipefail
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
source .venv/bin/activate
INSTALLER=${INSTALLER:-uv}
if [ "$INSTALLER" = uv ] && ! python -m pip install --quiet uv; then
    echo "setup.sh: cannot install uv; installing with pip" >&2
    INSTALLER=pip
fi
pip_upgraded=false
pip_install() {  # pip, brought up to date the first time it installs anything (3 s: not when uv does it all)
    if ! $pip_upgraded; then
        python -m pip install --quiet --upgrade pip
        pip_upgraded=true
    fi
    python -m pip install --quiet "$@"
}
export UV_INDEX_URL=${UV_INDEX_URL:-${PIP_INDEX_URL:-}}
export UV_EXTRA_INDEX_URL=${UV_EXTRA_INDEX_URL:-${PIP_EXTRA_INDEX_URL:-}}
export UV_FIND_LINKS=${UV_FIND_LINKS:-${PIP_FIND_LINKS:-}}
for name in UV_INDEX_URL UV_EXTRA_INDEX_URL UV_FIND_LINKS; do [ -n "${!name}" ] || unset "$name"; done

install() {  # pip-install arguments (--index-url URL and packages): uv first, then pip
    if [ "$INSTALLER" = uv ]; then
        # --compile-bytecode: the .pyc files pip writes at install. Without them every fresh
        # interpreter that may not write its own (PYTHONDONTWRITEBYTECODE, a read-only venv)
        # compiles torch's modules again: the suite's cold subprocesses took 3x the CPU.
        if python -m uv pip install --quiet --compile-bytecode --python "$(command -v python)" "$@"; then
            return 0
        fi
        echo "setup.sh: uv could not install $*; trying pip" >&2
    fi
    pip_install "$@"
}

# torch/torchvision pinned to the versions this project is tested with; any CUDA or CPU build works.
# Without an NVIDIA GPU they come from PyTorch's CPU-only index (scripts/torch_index.sh; TORCH_INDEX
# chooses); where that index cannot be reached (asked first: scripts/index_answers.sh) or cannot
# install them, from the default one, with a line saying so.
TORCH=("torch==2.14.1" "torchvision==0.29.1")
index=$(bash "$(dirname "${BASH_SOURCE[0]}")/torch_index.sh")
if [ -z "$index" ]; then
    install "${TORCH[@]}"
elif ! bash "$(dirname "${BASH_SOURCE[0]}")/index_answers.sh" "$index/" \
    || ! UV_HTTP_TIMEOUT=20 PIP_TIMEOUT=20 PIP_RETRIES=1 install --index-url "$index" "${TORCH[@]}" 2>/dev/null; then
    echo "setup.sh: cannot install torch from $index; installing it from the default index instead" \
        "(on Linux it brings the CUDA libraries)" >&2
    install "${TORCH[@]}"
fi
EXTRAS=${EXTRAS-train,demo}
# The test install holds the floored packages at their floors (scripts/floor_constraints.py): the
# suite runs on the versions pyproject.toml promises, not on whatever newer release came out since.
constraints=()
if [[ ",$EXTRAS," == *",test,"* ]]; then
    floors=$(mktemp)
    python "$(dirname "${BASH_SOURCE[0]}")/floor_constraints.py" > "$floors"
    constraints=(--constraint "$floors")
fi
install "${constraints[@]}" -e ".${EXTRAS:+[$EXTRAS]}"
# The package's own modules, compiled here once: the editable install leaves them as source, and
# an interpreter that may not write bytecode (PYTHONDONTWRITEBYTECODE, a read-only checkout)
# compiled each module it imported at every start (a quarter of a training command's start-up).
python -m compileall -q -j 0 captioner >/dev/null
