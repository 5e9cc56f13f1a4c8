#!/usr/bin/env bash
# Issue 29's per-processor table on the machine this runs on: the processor's name, then the
# quickstart step in fp32 and bf16, its profile, the decoder against the tutorial with our products
# and torch's, and the demo under load. Run it with nothing else running, from the repository root
# with the venv active; paste the numbers into docs/benchmarks.md beside the processor's name.
#   bash benchmarks/processor_table.sh [CHECKPOINT_FOR_THE_DEMO]   # default: the Flickr8k LSTM's best.pt
set -u
cd "$(dirname "$0")"
checkpoint=${1:-../runs/flickr8k_full/lstm/best.pt}
lscpu | grep -E "Model name|CPU family|Model:"
uptime
echo "=== bench_cpu_amp"; time python bench_cpu_amp.py --steps 4 --rounds 2
echo "=== profile_step"; time python profile_step.py --steps 8 --top 12
echo "=== bench_decoder"; time python bench_decoder.py
echo "=== bench_decoder --products torch"; time python bench_decoder.py --products torch
echo "=== bench_demo_load"; time python bench_demo_load.py "$checkpoint"
uptime
