#!/usr/bin/env bash
# What keeping documents apart costs in training (issue 65 item 4): tokens/s of a compiled forward +
# backward + AdamW step of every architecture's training form, documents joined and apart side by
# side at each point, 2,048-16,384 tokens, size=small and size=base as two jobs of one torch thread
# each, two at a time; each job stops starting points past its time budget (the longest lengths last).
#   bash experiments/train_throughput/documents.sh --replace    # the committed documents_{small,base}/
#   bash experiments/train_throughput/documents.sh              # a trial, under trial/
# Extra arguments are mcsd-bench overrides of both jobs (e.g. time_budget_s=600); each job's output is
# in its folder's log.txt.
set -euo pipefail
cd "$(dirname "$0")"
results=trial; if [ "${1:-}" = --replace ]; then results=.; shift; fi
for size in small base; do
  mkdir -p "$results/documents_$size"
  mcsd-bench mode=train bench=cpu_quick model_size="$size" "train.seq_lens=[2048,4096,8192,16384]" \
    "train.forms=[training]" "train.documents=[joined,apart]" compile=true threads=1 time_budget_s=3000 \
    wandb.enabled=false output_dir="$results/documents_$size" "$@" > "$results/documents_$size/log.txt" 2>&1 &
done
wait
for size in small base; do
  mcsd-plot experiment source="$results/documents_$size" name=train_throughput
done
