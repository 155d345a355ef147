#!/usr/bin/env bash
# Issue 31's measurements (one torch thread, nothing else running; ~5 minutes on the project's 2-core CPU):
#   1. batch-1 greedy decoding of 512 tokens at size=small, every architecture: transformers' generate on the
#      exported model class vs the project's own decoding (mcsd-generate's CausalLM.stream), alternating, medians of 5;
#   2. lm-eval's HFLM (what mcsd-eval runs) vs the hand-written lm-eval model it replaced, every sample of the
#      bundled local tasks, a tiny model of every architecture and variant;
#   3. (issue 92) 8 prompts of mixed lengths through generate: one padded batch (left, right) vs row by row,
#      MCSD and the Transformer at size=small, 128 new tokens each, alternating, medians of 5.
#   bash experiments/hf_transformers/run.sh [--replace]     # without --replace: writes to trial/
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/trial"; [ "${1:-}" = --replace ] && out="$here"
mkdir -p "$out"
export OMP_NUM_THREADS=1
python "$here/bench.py" --out "$out/results.csv" --tokens 512 --repeats 5 --threads 1
python "$here/plot.py" "$out/results.csv"
python "$here/compare_eval.py" --out "$out/compare_eval.csv"
python "$here/padded_batch.py" --out "$out/padded_batch.csv" --tokens 128 --repeats 5 --threads 1  # and its figure
