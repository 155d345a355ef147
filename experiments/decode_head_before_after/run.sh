#!/usr/bin/env bash
# Batch-1 compiled decoding before and after the fused LM head (issue 33 item 4), side by side
# in one run: the same mcsd-bench points with the code of a1cb6c9 (a worktree in /tmp, on
# PYTHONPATH: the LM head as a BLAS call) and with this checkout's (the LM head as one fused
# multiply-and-sum kernel), every architecture at size=small and size=base, 4096 tokens after a
# 128-token prompt, the median of 3 decodes. The two sides alternate per size, in rounds (this
# machine's speed moves by 2x within minutes: read the median over the rounds).
#   bash experiments/decode_head_before_after/run.sh [FIRST_ROUND [LAST_ROUND]]   # ~8 minutes a round
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../before_after.sh"  # code_of
for round in $(seq "${1:-1}" "${2:-3}"); do
  for size in small base; do
    for side in before after; do
      code="$(code_of "$side" a1cb6c9)"
      PYTHONPATH="$code" mcsd-bench bench=cpu_quick model_size=$size compile=true "inference.batch_sizes=[1]" \
        "inference.gen_lengths=[4096]" inference.repeats=3 output_dir="$here/round$round/$side/$size" wandb.enabled=false
    done
  done
done
