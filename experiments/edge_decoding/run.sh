#!/usr/bin/env bash
# Issue 67: decoding on a small CPU as the paper intends it for the edge: MCSD and the Transformer at
# size=base, batch 1 and 4, 1,024-8,192 generated tokens, weights full / int8 / int4, decoded by
# PyTorch eager, by ONNX Runtime through the model's export (eager/), and by PyTorch compiled
# (compiled/); one torch thread, waiting for a quiet machine.
#   bash experiments/edge_decoding/run.sh             # a trial, under trial/
#   bash experiments/edge_decoding/run.sh --replace   # the committed eager/ and compiled/
# Extra arguments are mcsd-bench overrides of both runs: time_budget_s=1800 stops each run after the
# point that ends within it, and resume=true goes on with what a stopped run left (a grid of hours in pieces).
set -euo pipefail
cd "$(dirname "$0")"
results=trial; if [ "${1:-}" = --replace ]; then results=.; shift; fi
grid=(mode=inference bench=cpu_quick model_size=base "models=[mcsd,transformer]" "inference.batch_sizes=[1,4]"
      "inference.gen_lengths=[1024,2048,4096,8192]" "weights=[full,int8,int4]" threads=1 busy_machine=wait
      wandb.enabled=false)
mcsd-bench "${grid[@]}" "runtimes=[torch,onnx]" output_dir="$results/eager" "$@"
mcsd-bench "${grid[@]}" "runtimes=[torch]" compile=true output_dir="$results/compiled" "$@"
for run in eager compiled; do
  mcsd-plot experiment source="$results/$run" name=edge_decoding
done
