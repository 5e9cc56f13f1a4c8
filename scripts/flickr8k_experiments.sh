#!/usr/bin/env bash
# The Flickr8k comparison of the README: the LSTM and the transformer on a frozen ImageNet
# EfficientNet-Lite0, and the LSTM trained blind (image features zeroed), same data and protocol:
# train on the train images, select on dev (val), evaluate once on test with beam 3 and the
# official metrics. Then the second stage of both image models: self-critical sequence training
# (CIDEr-D reward) from their cross-entropy checkpoints, evaluated the same way.
# Run it again after a crash or Ctrl-C: a model trained and scored is skipped, a training run cut short
# resumes from its last.pt, a finished one not yet scored is only scored (scripts/sweep_runs.sh).
# Usage: bash scripts/flickr8k_experiments.sh [DATA_ROOT]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-../shared/data/flickr8k}
source .venv/bin/activate
source scripts/sweep_runs.sh

run() {  # name config overrides...
    local name=$1 config=$2
    shift 2
    # the shared folder's 1,000 photos are a subset of the official lists: train on the ones there
    train_step "runs/$name" captioner train "$config" "data.root=$ROOT" data.max_missing_fraction=1 "$@"
    evaluate_step "runs/$name" captioner evaluate "runs/$name/best.pt" --split test --beam 3 --out "runs/$name"
}

run flickr8k_lstm_lite0 configs/flickr8k_lstm_lite0.yaml
run flickr8k_lstm_lite0_blind configs/flickr8k_lstm_lite0.yaml model.blind=true
run flickr8k_transformer_lite0 configs/flickr8k_transformer_lite0.yaml
run flickr8k_lstm_lite0_scst configs/flickr8k_lstm_lite0_scst.yaml train.init=runs/flickr8k_lstm_lite0/best.pt
run flickr8k_transformer_lite0_scst configs/flickr8k_transformer_lite0_scst.yaml \
    train.init=runs/flickr8k_transformer_lite0/best.pt
python scripts/results_table.py runs/flickr8k_lstm_lite0 runs/flickr8k_lstm_lite0_scst runs/flickr8k_transformer_lite0 \
    runs/flickr8k_transformer_lite0_scst runs/flickr8k_lstm_lite0_blind
