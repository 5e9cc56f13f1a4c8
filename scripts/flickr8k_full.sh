#!/usr/bin/env bash
# Flickr8k, the full official protocol (6,000 train / 1,000 dev / 1,000 test photographs, five
# captions each) against Xu et al. 2015, Table 1: every model of the README's table, in one
# command, resumable. Frozen ImageNet EfficientNet-Lite0 grids, encoded once into one fp16
# feature store shared by every run. Each model is trained on train, selected on dev, its beam
# search length penalty tuned on dev (the alpha with the best dev CIDEr-D, the metric checkpoints
# are selected on), and scored once on test with the official metrics. Then the report (human
# row, caption statistics, gallery, worst images) and the export of the default model.
#
# Usage: bash scripts/flickr8k_full.sh [DATA_ROOT] [IMAGE_ROOT] [STEP ...]
#   DATA_ROOT   Flickr8k.token.txt and the split files (default data/flickr8k, where
#               `captioner data flickr8k --root data/flickr8k` unpacks the dataset)
#   IMAGE_ROOT  the photographs (default: the config's, DATA_ROOT/images else DATA_ROOT/Flicker8k_Dataset;
#               "" keeps that default when steps follow)
#   STEP        only these steps (lstm, lstm_blind, transformer, lstm_scst, transformer_scst, ensemble, report, export)
# Run it again after a crash or Ctrl-C: finished steps are skipped (a finished training run has its
# finished.json, a scored one a `score.done` file), a stopped training run resumes exactly from its
# last.pt (scripts/sweep_runs.sh). The time of every invocation of a step goes to $OUT/timings.tsv
# with the processor's name and its exit status, stopped ones too, and the totals per step and in
# all are printed at the end. OUT defaults to runs/flickr8k_full.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-data/flickr8k}
IMAGES=${2:-}
shift $(( $# < 2 ? $# : 2 ))
STEPS=("$@")
OUT=${OUT:-runs/flickr8k_full}
ALPHAS=${ALPHAS:-0,0.5,1,1.5,2}
ALL_STEPS="lstm lstm_blind transformer lstm_scst transformer_scst ensemble report export"
for step in "${STEPS[@]}"; do  # a misspelt step would run nothing, silently
    if [[ " $ALL_STEPS " != *" $step "* ]]; then
        echo "flickr8k_full.sh: step '$step' is not one of: $ALL_STEPS" >&2
        exit 2
    fi
done
if [ ! -f "$ROOT/Flickr8k.token.txt" ]; then
    echo "flickr8k_full.sh: $ROOT/Flickr8k.token.txt not found: fetch Flickr8k with" \
        "\`captioner data flickr8k --root $ROOT\`, or name its folder as the first argument" >&2
    exit 2
fi
if ! mkdir -p "$OUT" 2>/dev/null || [ ! -w "$OUT" ]; then
    echo "flickr8k_full.sh: OUT=$OUT: not a folder it can write into" >&2
    exit 2
fi
source .venv/bin/activate
source scripts/sweep_runs.sh
touch "$OUT/timings.tsv"  # the table printed at the end, if no step runs
DATA=("data.root=$ROOT" ${IMAGES:+"data.image_root=$IMAGES"} "data.feature_store=$OUT/features_lite0")
CPU=$(lscpu | sed -n 's/^Model name: *//p' | head -1)

wanted() {  # is step $1 asked for (all are when none is named)?
    [ ${#STEPS[@]} -eq 0 ] && return 0
    local s
    for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done
    return 1
}

STEP_NAME="" STEP_START=0  # the step running now, so that a signal ending the script still records its time
record() {  # status: append the running step's seconds, the time, the processor and the status to timings.tsv
    printf '%s\t%s\t%s\t%s\t%s\n' "$STEP_NAME" "$(( $(date +%s) - STEP_START ))" "$(date -u +%FT%TZ)" "$CPU" "$1" \
        >> "$OUT/timings.tsv"
    STEP_NAME=""
}
ended_by() {  # signal number: record the running step with the shell's status for that signal, then die of it
    local signal=$1
    [ -n "$STEP_NAME" ] && record $(( 128 + signal ))
    trap - "$signal"
    kill -s "$signal" $$
}
# Ctrl-C, kill or a closed terminal: bash runs these once the step's command has ended (it gets the
# signal too when the whole process group does: Ctrl-C, `kill -- -PGID`); SIGKILL leaves no row.
trap 'ended_by 1' HUP
trap 'ended_by 2' INT
trap 'ended_by 15' TERM

timed() {  # name command...: run it, append its seconds and exit status to timings.tsv, even when it
    # fails or is stopped (a resumed step's time is then the sum of its rows), and return its status
    local status=0
    STEP_NAME=$1 STEP_START=$(date +%s)
    shift
    "$@" || status=$?
    record "$status"
    return "$status"
}

train() {  # name config overrides...: train, resume or skip $OUT/name as scripts/sweep_runs.sh decides
    local name=$1 config=$2 run=$OUT/$1
    shift 2
    # a run that an earlier version of this script finished has its mark instead of the run's finished.json
    if [ -f "$run/train.done" ]; then echo "== $name: trained (remove $run/train.done to train again)"; return; fi
    train_step "$run" timed "train $name" captioner train "$config" "${DATA[@]}" "$@"
}

# sweep.json...: "<file> <alpha>" of the variant with the best dev CIDEr-D, the metric checkpoints are selected on
best_on_dev() {
    python -c 'import json, sys
file, best = max(((f, v) for f in sys.argv[1:] for v in json.load(open(f))["variants"]),
                 key=lambda fv: fv[1]["overall"]["CIDEr"])
print(file, best["options"]["length_penalty"])' "$@"
}

score() {  # name: tune the length penalty on dev, then score test once with it
    local name=$1 run=$OUT/$1
    if [ -f "$run/score.done" ]; then echo "== $name: scored"; return; fi
    echo "== $name: length penalty on dev ($ALPHAS)"
    timed "dev $name" python scripts/compare_decoding.py "$run/best.pt" --split val --length-penalties "$ALPHAS" \
        --json "$run/length_penalty_val.json" | tee "$run/length_penalty_val.md"
    local alpha
    read -r _ alpha < <(best_on_dev "$run/length_penalty_val.json")
    echo "$alpha" > "$run/length_penalty"
    echo "== $name: test, beam 3, length penalty $alpha"
    timed "test $name" captioner evaluate "$run/best.pt" --split test --beam 3 --length-penalty "$alpha" --out "$run"
    touch "$run/score.done"
}

model() {  # name config overrides...: train and score
    wanted "$1" || return 0
    train "$@"
    score "$1"
}

model lstm configs/flickr8k_lstm_lite0.yaml
model lstm_blind configs/flickr8k_lstm_lite0.yaml model.blind=true
model transformer configs/flickr8k_transformer_lite0.yaml
model lstm_scst configs/flickr8k_lstm_lite0_scst.yaml "train.init=$OUT/lstm/best.pt"
model transformer_scst configs/flickr8k_transformer_lite0_scst.yaml "train.init=$OUT/transformer/best.pt"

checkpoints() {  # "a+b+c": the runs' best.pt files, one per line
    local name
    for name in ${1//+/ }; do echo "$OUT/$name/best.pt"; done
}

ensemble() {  # each candidate of $ENSEMBLES tuned on dev; the best on dev scored once on test, into $OUT/ensemble
    local run=$OUT/ensemble candidate
    local -a members
    if [ -f "$run/score.done" ]; then echo "== ensemble: scored"; return; fi
    mkdir -p "$run"
    for candidate in $ENSEMBLES; do
        [ -f "$run/$candidate.val.json" ] && continue
        mapfile -t members < <(checkpoints "$candidate")
        echo "== ensemble $candidate: length penalty on dev ($ALPHAS)"
        timed "dev ensemble $candidate" python scripts/compare_decoding.py "${members[0]}" \
            --ensemble "${members[@]:1}" --split val \
            --length-penalties "$ALPHAS" --json "$run/$candidate.val.json" | tee "$run/$candidate.val.md"
    done
    read -r candidate alpha < <(best_on_dev $(for candidate in $ENSEMBLES; do echo "$run/$candidate.val.json"; done))
    candidate=$(basename "$candidate" .val.json)
    echo "$candidate" > "$run/members"
    echo "$alpha" > "$run/length_penalty"
    mapfile -t members < <(checkpoints "$candidate")
    echo "== ensemble $candidate (best on dev): test, beam 3, length penalty $alpha"
    timed "test ensemble" captioner evaluate "${members[0]}" --ensemble "${members[@]:1}" --split test --beam 3 \
        --length-penalty "$alpha" --out "$run"
    touch "$run/score.done"
}
# The trained models decoded as one (their probabilities averaged at every step), as
# self-critical.pytorch's ensemble evaluation does; which models, and the length penalty, chosen on dev.
DEFAULT_ENSEMBLES="lstm_scst+transformer lstm+lstm_scst+transformer lstm_scst+transformer_scst"
DEFAULT_ENSEMBLES+=" lstm+lstm_scst+transformer_scst"
ENSEMBLES=${ENSEMBLES:-$DEFAULT_ENSEMBLES}
if wanted ensemble; then ensemble; fi

# Every run that was scored goes into the report; the default model is the best single network by
# dev CIDEr-D (at its dev-tuned length penalty), as every other choice of the protocol is made on dev.
runs=()
for name in lstm lstm_scst transformer transformer_scst ensemble lstm_blind; do
    [ -f "$OUT/$name/score.done" ] && runs+=(--run "$name=$OUT/$name")
done
# The default model is one network (an export holds one; the demo serves one): not the ensemble.
best=$(python -c 'import json, sys
dev = lambda n: max(v["overall"]["CIDEr"]
                   for v in json.load(open(f"{sys.argv[1]}/{n}/length_penalty_val.json"))["variants"])
runs = {n: dev(n) for n in sys.argv[2:] if n not in ("lstm_blind", "ensemble")}
print(max(runs, key=runs.get) if runs else "")' "$OUT" \
    $(for r in "${runs[@]}"; do [ "$r" != --run ] && echo "${r%%=*}"; done))
if wanted report && [ -n "$best" ]; then
    echo "== report (best: $best)"
    gallery=()
    [ -d "$ROOT/images" ] && gallery=(--gallery-images "$ROOT/images")  # full-resolution originals, where present
    timed "report" python scripts/flickr8k_report.py "${runs[@]}" --best "$best" --out "$OUT/report" "${gallery[@]}"
fi
if wanted export && [ -n "$best" ]; then
    echo "== export $best (length penalty $(cat "$OUT/$best/length_penalty")) -> runs/default_model"
    timed "export" captioner export "$OUT/$best/best.pt" runs/default_model --beam 3 \
        --length-penalty "$(cat "$OUT/$best/length_penalty")"
fi
echo "== timings ($OUT/timings.tsv: step, seconds, ended, processor, exit status)"
cat "$OUT/timings.tsv"
# Every invocation of a step adds a row (a stopped and resumed training run, several): the totals.
awk -F'\t' '{ total[$1] += $2; all += $2 }
    END { for (step in total) printf "%-48s %7.1f min\n", step, total[step] / 60
          printf "%-48s %7.1f min\n", "all steps", all / 60 }' "$OUT/timings.tsv" | sort
