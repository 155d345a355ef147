#!/usr/bin/env bash
# Decoding and training speed before and after issue 17's lean steps, side by side in one run:
# the same mcsd-bench points with the code of 1ab3077 (a worktree in /tmp, on PYTHONPATH) and
# with this checkout's.
#   bash experiments/lean_step_before_after/run.sh     # ~15 minutes on 2 cores
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
before=/tmp/mcsd_before_lean_step
[ -d "$before" ] || git -C "$here" worktree add -q "$before" 1ab3077
for side in before after; do
  code="$before"; [ "$side" = after ] && code="$(git -C "$here" rev-parse --show-toplevel)"
  PYTHONPATH="$code" mcsd-bench bench=cpu_quick "inference.gen_lengths=[4096]" output_dir="$here/$side/inference" \
    wandb.enabled=false
  PYTHONPATH="$code" mcsd-bench bench=cpu_quick mode=train "train.seq_lens=[1024,4096]" memory_limit_mb=16000 \
    output_dir="$here/$side/train" wandb.enabled=false
done
