#!/usr/bin/env bash
# Set up a fresh machine and run the main job on the built-in defaults: train the Show-Attend-Tell
# LSTM on the shapes world (generated on first use), evaluate on the test split, write heatmaps.
#   bash scripts/quickstart.sh [overrides or train options]   e.g. train.epochs=3 train.out_dir=runs/mine
# CONFIG=configs/shapes_transformer.yaml picks another shapes config.
set -euo pipefail
cd "$(dirname "$0")/.."
source "${SETUP:-scripts/setup.sh}"

CONFIG=${CONFIG:-configs/shapes_lstm.yaml}
# The run folder, the world's folder and the start checkpoint as the overrides and --init make them (other options,
# such as --resume, go to train alone; --init comes last, as train sets it over train.init).
overrides=() init=() previous=
for arg in "$@"; do
    if [[ $previous == --init ]]; then init=("train.init=$arg")
    elif [[ $arg == --init=* ]]; then init=("train.init=${arg#--init=}")
    elif [[ $arg == *=* && $arg != -* ]]; then overrides+=("$arg")
    fi
    previous=$arg
done
resolved=$(python - "$CONFIG" "${overrides[@]}" "${init[@]}" <<'PY'
import sys
from pathlib import Path
from captioner.core.config import load_config
from captioner.core.errors import CaptionerError, ConfigError
def refuse(message: str) -> None:  # one line, exit status 2: a user's mistake, as captioner's commands say one
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)
try:
    config = load_config(sys.argv[1], sys.argv[2:])
except ConfigError as e:
    refuse(str(e))
if config.data.dataset != "shapes":
    refuse(f"{sys.argv[1]}: the quickstart runs a shapes config (data.dataset: shapes); see docs/training.md for "
           "the others")
run = Path(config.train.out_dir)
if run.is_dir():  # a run training there now: its folder is neither moved aside from under it nor trained into
    from captioner.training.run_folders import hold_run_folder
    try:
        hold_run_folder(run)  # let go as this process ends
    except CaptionerError as e:
        refuse(str(e))
print(run)  # runs/mine/ as runs/mine, the name its earlier run is moved aside from
print(config.data.root)
init = Path(config.train.init or run).resolve()  # train.init's place in the run folder, if it is in it
print(init.relative_to(run.resolve()) if init.is_relative_to(run.resolve()) and init != run.resolve() else "")
PY
)
RUN=$(sed -n 1p <<<"$resolved")
WORLD=$(sed -n 2p <<<"$resolved")
INIT_IN_RUN=$(sed -n 3p <<<"$resolved")

# `captioner train` refuses a new run into a folder that holds one (best.pt or last.pt) without --resume:
# run again (train.epochs=3 after a full run, say), the script moves its earlier run aside, deleting nothing.
resume=false
for arg in "$@"; do [[ $arg == --resume ]] && resume=true; done
if ! $resume && [[ -e $RUN/best.pt || -e $RUN/last.pt ]]; then
    n=1
    while [[ -e $RUN.previous-$n ]]; do n=$((n + 1)); done
    mv "$RUN" "$RUN.previous-$n"
    echo "note: the earlier run in $RUN is kept as $RUN.previous-$n (--resume continues a run instead)"
    if [[ -n $INIT_IN_RUN ]]; then  # the start checkpoint moved with the earlier run: train from it there
        set -- "$@" --init "$RUN.previous-$n/$INIT_IN_RUN"  # the last --init is the one train takes
        echo "note: train.init is in the earlier run, so the new run starts from $RUN.previous-$n/$INIT_IN_RUN"
    fi
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
