#!/usr/bin/env bash
# Figs. 5-8: inference memory, latency and throughput of MCSD and the Transformer.
#   bash experiments/fig5-8_inference/run.sh               # bench=cpu_quick, on a CPU (~4 minutes)
#   bash experiments/fig5-8_inference/run.sh paper         # the paper's grid, on a GPU
# Results go to trial/<bench>/, or with --replace (first argument) to <bench>/, the committed ones.
set -euo pipefail
cd "$(dirname "$0")"
results=trial; if [ "${1:-}" = --replace ]; then results=.; shift; fi
bench="${1:-cpu_quick}"
mcsd-bench bench="$bench" output_dir="$results/$bench" "${@:2}"
mcsd-plot experiment source="$results/$bench" name=fig5-8_inference
