#!/usr/bin/env bash
# The backbone comparison of docs/encoders.md: the Flickr8k LSTM of configs/flickr8k_lstm_lite0.yaml
# on frozen ImageNet EfficientNet-Lite0, -Lite1 and -Lite2 (224, 240 and 260 px: 7x7, 8x8 and 9x9
# grids), same captions, vocabulary and protocol: train on the train images, select on dev,
# evaluate once on test with beam 3 and the official metrics, then a paired bootstrap of each
# larger backbone's CIDEr-D against Lite0's. Prints each run's training time and store size.
# Run it again after a crash or Ctrl-C: a model trained and scored is skipped, a training run cut short
# resumes from its last.pt, a finished one not yet scored is only scored (scripts/sweep_runs.sh).
# Usage: bash scripts/flickr8k_backbones.sh [DATA_ROOT] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-../shared/data/flickr8k}
RUNS=${2:-runs}
source .venv/bin/activate
source scripts/sweep_runs.sh

for n in 0 1 2; do
    run=$RUNS/flickr8k_lstm_lite$n
    before=$(python scripts/run_state.py "$run")
    start=$(date +%s)
    # the shared folder's 1,000 photos are a subset of the official lists: train on the ones there
    train_step "$run" captioner train configs/flickr8k_lstm_lite$n.yaml "data.root=$ROOT" data.max_missing_fraction=1
    case $before in  # the time of a training run this invocation made (from its start, or from its resume)
        new) echo "lite$n: trained in $(( $(date +%s) - start )) s (feature store included);" \
                  "store $(du -sh "$run/features" | cut -f1)" ;;
        stopped) echo "lite$n: $(( $(date +%s) - start )) s since its resume;" \
                      "store $(du -sh "$run/features" | cut -f1)" ;;
    esac
    evaluate_step "$run" captioner evaluate "$run/best.pt" --split test --beam 3 --out "$run"
done
for n in 1 2; do
    python scripts/paired_bootstrap.py "$RUNS/flickr8k_lstm_lite0" "$RUNS/flickr8k_lstm_lite$n"
done
python scripts/results_table.py "$RUNS"/flickr8k_lstm_lite{0,1,2}
