#!/usr/bin/env bash
# Training cost: tokens/s, peak memory and MFU of a forward + backward + AdamW step vs
# sequence length, for MCSD parallel, MCSD chunkwise and the Transformer (SDPA).
#   bash experiments/train_throughput/run.sh               # bench=cpu_quick, on a CPU (~4 minutes)
#   bash experiments/train_throughput/run.sh paper         # 1.6B, up to 16384 tokens, on a GPU
# Results go to trial/<bench>/, or with --replace (first argument) to <bench>/, the committed ones.
set -euo pipefail
cd "$(dirname "$0")"
results=trial; if [ "${1:-}" = --replace ]; then results=.; shift; fi
bench="${1:-cpu_quick}"
mcsd-bench mode=train bench="$bench" output_dir="$results/$bench" "${@:2}"
mcsd-plot experiment source="$results/$bench" name=train_throughput
