#!/usr/bin/env bash
# The hybrid's training step before and after its attention layer's key bias is folded into the
# fused causal kernel (issue 33), side by side in one run: the same mcsd-bench points with the
# code of 1ec602d (a worktree in /tmp, on PYTHONPATH: a [B, H, N, N] biased mask) and with this
# checkout's, the Wonderful Matrices hybrid at size=small in its training form (chunk), eager,
# batch 1, 4096 / 8192 / 16384 tokens, the median of 2 steps; the two sides alternate per length.
#   bash experiments/hybrid_attention_before_after/run.sh     # ~8 minutes on 2 cores
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../before_after.sh"  # code_of
for length in 4096 8192 16384; do
  for side in before after; do
    code="$(code_of "$side" 1ec602d)"
    PYTHONPATH="$code" mcsd-bench mode=train bench=cpu_quick "models=[wonderful_matrices]" "train.forms=[training]" \
      "train.seq_lens=[$length]" train.repeats=2 memory_limit_mb=20000 wandb.enabled=false \
      output_dir="$here/$side/$length"
  done
done
