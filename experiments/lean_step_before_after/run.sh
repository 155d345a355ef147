#!/usr/bin/env bash
# Decoding and training speed before and after issue 17's lean steps, side by side in one run:
# the same mcsd-bench points with the code of 1ab3077 (a worktree in /tmp, on PYTHONPATH) and
# with this checkout's.
#   bash experiments/lean_step_before_after/run.sh     # ~15 minutes on 2 cores
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../before_after.sh"  # code_of
for side in before after; do
  code="$(code_of "$side" 1ab3077)"
  PYTHONPATH="$code" mcsd-bench bench=cpu_quick "inference.gen_lengths=[4096]" output_dir="$here/$side/inference" \
    wandb.enabled=false
  PYTHONPATH="$code" mcsd-bench bench=cpu_quick mode=train "train.seq_lens=[1024,4096]" memory_limit_mb=16000 \
    output_dir="$here/$side/train" wandb.enabled=false
done
