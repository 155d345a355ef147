#!/usr/bin/env bash
# Figs. 5-8: inference memory, latency and throughput of MCSD and the Transformer.
#   bash experiments/fig5-8_inference/run.sh               # bench=cpu_quick, on a CPU (~4 minutes)
#   bash experiments/fig5-8_inference/run.sh paper         # the paper's grid, on a GPU
set -euo pipefail
cd "$(dirname "$0")"
bench="${1:-cpu_quick}"
mcsd-bench bench="$bench" output_dir="$bench" "${@:2}"
mcsd-plot inference "$bench/results.csv"
