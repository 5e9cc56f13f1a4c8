#!/usr/bin/env bash
# Set up a fresh machine and run the main job on the built-in defaults: generate the shapes
# world, train the Show-Attend-Tell LSTM on it, evaluate on the test split, write heatmaps.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

CONFIG=${CONFIG:-configs/shapes_lstm.yaml}
RUN=$(python -c "from captioner.core.config import load_config; print(load_config('$CONFIG').train.out_dir)")

captioner data shapes --out data/shapes
captioner train "$CONFIG" "$@"
captioner evaluate "$RUN/best.pt" --split test --beam 3
captioner caption "$RUN/best.pt" data/shapes/test/test_00000{0,1,2,3}.jpg --beam 3 --heatmaps "$RUN/heatmaps"
echo "heatmap figures: $RUN/heatmaps/"
