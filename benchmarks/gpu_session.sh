#!/usr/bin/env bash
# Every GPU check of docs/gpu.md in one run, for a GPU lent for a few minutes (docs/gpu.md says what each step does):
#
#   bash benchmarks/gpu_session.sh [OUT] [REFERENCE]     # OUT: runs/gpu_session; REFERENCE: bench_gpu's --reference
#
# STEPS="environment lstm_train ..." runs only the steps named; BENCH_PARTS sets bench_gpu's --parts.
# Each step has its own time limit, a failed step does not stop the next, and everything goes to
# OUT/session.log. It runs the python3 on the PATH with this checkout on PYTHONPATH (a GPU machine's
# own torch). CPU_SMOKE=1 runs the same steps on the CPU at tiny sizes: a rehearsal, no numbers.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(mkdir -p "${1:-runs/gpu_session}" && cd "${1:-runs/gpu_session}" && pwd)
REFERENCE=${2:-${CAPTIONER_REFERENCE:-}}
WORK=$(mktemp -d -t gpu_session_XXXX)
PY=${PYTHON:-python3}
# PYTHONFAULTHANDLER: a step stopped by its time limit gets SIGABRT first, and Python prints where
# every thread was (a run that stalls says where, not only that it stalled).
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
exec > >(tee -a "$OUT/session.log") 2>&1

FAILED=()
step() {  # step NAME SECONDS COMMAND...: run it under a time limit and say how it ended
    local name=$1 limit=$2 start=$SECONDS rc
    shift 2
    if [ -n "${STEPS:-}" ] && [[ " $STEPS " != *" $name "* ]]; then return; fi
    echo; echo "=== $name (limit ${limit} s) $(date +%T)"
    timeout --signal=ABRT --kill-after=10 "$limit" "$@"
    rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s$([ $rc = 124 ] && echo ', TIME LIMIT')"
    [ $rc = 0 ] || FAILED+=("$name")
}

if [ "${CPU_SMOKE:-0}" = 1 ]; then
    DEVICE=cpu SCALE=(data.shapes_num_train=64 data.shapes_num_val=8 data.image_size=64 model.encoder.width=8)
    BENCH=(--device cpu --tiny) BENCH_STEPS=() CHECK=(--device cpu --batch 4 --repeats 1)
else
    DEVICE=cuda SCALE=(data.shapes_num_train=3000 data.shapes_num_val=64)
    BENCH=() BENCH_STEPS=(--steps 12 --warmup 3) CHECK=()
fi
SHAPES=(data.root="$WORK/shapes" data.shapes_num_test=32 "${SCALE[@]}" train.device=$DEVICE train.val_max_images=64)
TEST_IMAGES=("$WORK"/shapes/test/test_00000{0,1}.jpg)

# The kernel names the sandbox (gVisor reports 4.4.0, Firecracker 6.x): host-bound rows differ between them.
environment() {  # the GPU and its driver, the cores, the kernel, the processor; Python's, torch's and CUDA's versions
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
    nproc; uname -r
    grep -m1 'model name' /proc/cpuinfo
    $PY -c 'import sys, torch, torchvision
print(sys.version.split()[0], "torch", torch.__version__, "torchvision", torchvision.__version__, "cuda",
      torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
}
export -f environment
export PY
step environment 60 bash -c environment

# The benchmark first: it is what a session owes (docs/gpu.md), and a later step that stalls cannot cost it.
step bench_gpu 330 $PY -m benchmarks gpu "${BENCH[@]}" "${BENCH_STEPS[@]}" ${BENCH_PARTS:+--parts $BENCH_PARTS} \
    --out "$OUT/bench_gpu.json" ${REFERENCE:+--reference "$REFERENCE"}

step lstm_train 150 $PY -m captioner train configs/shapes_lstm.yaml "${SHAPES[@]}" train.out_dir="$WORK/lstm" \
    train.epochs=2
step lstm_scst 120 $PY -m captioner train configs/shapes_lstm_scst.yaml "${SHAPES[@]}" train.out_dir="$WORK/lstm_scst" \
    train.init="$WORK/lstm/best.pt" train.epochs=1
step lstm_evaluate 60 $PY -m captioner evaluate "$WORK/lstm_scst/best.pt" --split test --beam 3 --fast --device $DEVICE
step lstm_caption 60 $PY -m captioner caption "$WORK/lstm_scst/best.pt" "${TEST_IMAGES[@]}" --beam 3 --device $DEVICE \
    --heatmaps "$WORK/heatmaps"
step lstm_cuda_graphs 120 $PY -m benchmarks cuda_graphs "$WORK/lstm/best.pt" "$WORK/shapes/test" "${CHECK[@]}"
first_heatmap=$(ls "$WORK"/heatmaps/*.png 2>/dev/null | head -1)
[ -n "$first_heatmap" ] && cp "$first_heatmap" "$OUT/lstm_heatmap_on_$DEVICE.png"

step transformer_train_compiled 200 $PY -m captioner train configs/shapes_transformer.yaml "${SHAPES[@]}" \
    train.out_dir="$WORK/transformer" train.epochs=12 train.compile=true train.channels_last=true
# The LSTM's teacher forcing compiled too: its packed positions are host indices copied to the device.
step lstm_train_compiled 120 $PY -m captioner train configs/shapes_lstm.yaml "${SHAPES[@]}" \
    train.out_dir="$WORK/lstm_compiled" train.epochs=1 train.compile=true train.channels_last=true
step transformer_caption 60 $PY -m captioner caption "$WORK/transformer/best.pt" "${TEST_IMAGES[@]}" --beam 3 \
    --device $DEVICE
step transformer_cuda_graphs 120 $PY -m benchmarks cuda_graphs "$WORK/transformer/best.pt" "$WORK/shapes/test" \
    "${CHECK[@]}"
step torchrun_one_rank 120 $PY -m torch.distributed.run --standalone --nproc_per_node=1 -m captioner train \
    configs/shapes_lstm.yaml "${SHAPES[@]}" train.out_dir="$WORK/lstm_torchrun" train.epochs=1

LITE0=(model.encoder.name=efficientnet_lite0 model.encoder.pretrained=true data.image_size=128)
step lstm_finetune_store 150 $PY -m captioner train configs/shapes_lstm.yaml "${SHAPES[@]}" "${LITE0[@]}" \
    model.encoder.fine_tune_blocks=2 train.encoder_lr=1e-4 train.out_dir="$WORK/lstm_lite0_ft2" train.epochs=2
# data.features_on_device: the same frozen-Lite0 store read from host memory, then held on the GPU
# (the store is built by the first run and reused; the epochs' seconds are in each log line).
step lstm_store_host 120 $PY -m captioner train configs/shapes_lstm.yaml "${SHAPES[@]}" "${LITE0[@]}" \
    data.feature_store="$WORK/store_lite0" train.out_dir="$WORK/lstm_store_host" train.epochs=2
step lstm_store_on_device 120 $PY -m captioner train configs/shapes_lstm.yaml "${SHAPES[@]}" "${LITE0[@]}" \
    data.feature_store="$WORK/store_lite0" data.features_on_device=true train.out_dir="$WORK/lstm_store_on_device" \
    train.epochs=2
streamed() {  # streamed SHAPES...: the shapes world written as shards, then trained on from them
    $PY -m captioner data shards configs/shapes_lstm.yaml "$@" --out "$WORK/shards" --splits train,val --max-count 500 \
        --quiet || return
    local last
    last=$(printf %05d $(($(ls "$WORK"/shards/train/*.tar | wc -l) - 1)))
    $PY -m captioner train configs/shapes_lstm.yaml "$@" data.dataset=webdataset \
        "data.train_shards=$WORK/shards/train/{00000..$last}.tar" "data.val_shards=$WORK/shards/val/00000.tar" \
        data.num_workers=4 train.out_dir="$WORK/lstm_streamed" train.epochs=1
}
export -f streamed
export PY WORK
step lstm_streamed 150 bash -c 'streamed "$@"' streamed "${SHAPES[@]}"

for config in lstm transformer; do
    step bench_graphs_$config 100 env TORCH_LOGS=recompiles $PY -m benchmarks gpu "${BENCH[@]}" --steps 1 --warmup 1 \
        --configs coco_${config}_resnet101 --parts graphs --out "$OUT/bench_graphs_$config.json"
done

for mode in transform decode; do
    step bench_gpu_$mode 90 $PY -m benchmarks gpu "${BENCH[@]}" "${BENCH_STEPS[@]}" --configs coco_lstm_resnet101 \
        --parts training --device-preprocess $mode --out "$OUT/bench_gpu_$mode.json"
done

rm -rf "$WORK"
echo; echo "=== done: ${#FAILED[@]} step(s) failed${FAILED:+: ${FAILED[*]}}"
[ ${#FAILED[@]} = 0 ]
