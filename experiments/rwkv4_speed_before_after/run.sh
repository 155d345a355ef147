#!/usr/bin/env bash
# RWKV-4's training speed before and after issue 33 (the loop-free WKV carry, the WKV's logits
# from one offset table, chunk size 8), side by side in one run: the same mcsd-bench points with
# the code of c2ace2c (a worktree in /tmp, on PYTHONPATH) and with this checkout's, MCSD beside
# it as the reference. A training step (forward, backward, AdamW) of each architecture's
# training form: issue 33's shape (size=tiny, 16 x 256 tokens, 1 thread) and size=small at
# 16 x 256 and 1 x 4096 (2 threads).
#   bash experiments/rwkv4_speed_before_after/run.sh     # ~10 minutes on 2 cores
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../before_after.sh"  # code_of
for side in before after; do
  code="$(code_of "$side" c2ace2c)"
  common=(mode=train "models=[rwkv4,mcsd]" "train.forms=[training]" memory_limit_mb=16000 wandb.enabled=false)
  PYTHONPATH="$code" mcsd-bench bench=compare "${common[@]}" model_size=tiny threads=1 output_dir="$here/$side/tiny"
  PYTHONPATH="$code" mcsd-bench bench=compare "${common[@]}" output_dir="$here/$side/small"
  PYTHONPATH="$code" mcsd-bench bench=compare "${common[@]}" train.batch_size=1 "train.seq_lens=[4096]" \
    output_dir="$here/$side/small_4096"
done
