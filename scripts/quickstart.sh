#!/usr/bin/env bash
# Set up a fresh machine and run the main job on the built-in defaults: train the Show-Attend-Tell
# LSTM on the shapes world (generated on first use), evaluate on the test split, write heatmaps.
#   bash scripts/quickstart.sh [overrides or train options]   e.g. train.epochs=3 train.out_dir=runs/mine
# CONFIG=configs/shapes_transformer.yaml picks another shapes config.
set -euo pipefail
cd "$(dirname "$0")/.."
source "${SETUP:-scripts/setup.sh}"

CONFIG=${CONFIG:-configs/shapes_lstm.yaml}
# The run folder and the world's folder as the overrides make them (options such as --resume go to train alone).
overrides=()
for arg in "$@"; do [[ $arg == *=* && $arg != -* ]] && overrides+=("$arg"); done
resolved=$(python - "$CONFIG" "${overrides[@]}" <<'PY'
import sys
from pathlib import Path
from captioner.core.config import load_config
from captioner.core.errors import ConfigError
try:
    config = load_config(sys.argv[1], sys.argv[2:])
except ConfigError as e:
    sys.exit(f"error: {e}")
if config.data.dataset != "shapes":
    sys.exit(f"error: {sys.argv[1]}: the quickstart runs a shapes config (data.dataset: shapes); "
             "see docs/training.md for the others")
print(Path(config.train.out_dir))  # runs/mine/ as runs/mine, the name its earlier run is moved aside from
print(config.data.root)
PY
)
RUN=$(sed -n 1p <<<"$resolved")
WORLD=$(sed -n 2p <<<"$resolved")

# `captioner train` refuses a new run into a folder that holds one (best.pt or last.pt) without --resume:
# run again (train.epochs=3 after a full run, say), the script moves its earlier run aside, deleting nothing.
resume=false
for arg in "$@"; do [[ $arg == --resume ]] && resume=true; done
if ! $resume && [[ -e $RUN/best.pt || -e $RUN/last.pt ]]; then
    n=1
    while [[ -e $RUN.previous-$n ]]; do n=$((n + 1)); done
    mv "$RUN" "$RUN.previous-$n"
    echo "note: the earlier run in $RUN is kept as $RUN.previous-$n (--resume continues a run instead)"
fi

# The official metrics (METEOR, and the PTB tokenizer of them all) run on Java: without it, say so
# now and score with the in-process BLEU and CIDEr-D instead of failing after training.
SCORING=()
if ! command -v java >/dev/null 2>&1; then
    echo "note: Java not found, so the test split is scored with the in-process BLEU and CIDEr-D (--fast);"
    echo "      for the official metrics install Java 17 (Debian/Ubuntu: apt-get install openjdk-17-jre-headless)"
    SCORING=(--fast)
fi

captioner train "$CONFIG" "$@"
captioner evaluate "$RUN/best.pt" --split test --beam 3 "${SCORING[@]}"
captioner caption "$RUN/best.pt" "$WORLD"/test/test_00000{0,1,2,3}.jpg --beam 3 --heatmaps "$RUN/heatmaps"
echo "heatmap figures: $RUN/heatmaps/"
printf '%s\n' "" "What next (in your shell, first: source .venv/bin/activate):" \
    "  caption your photograph (the packaged model):  captioner caption photo.jpg --heatmaps figures/" \
    "  the demo, word by word in a browser:           captioner demo" \
    "  train on your own photos:                      docs/training.md#your-own-photographs"
