#!/usr/bin/env bash
# Batch-1 compiled decoding before and after the fused matrix-vector products (issue 33 item 4),
# side by side in one run: the same mcsd-bench points with the code of f904391 (a worktree in
# /tmp, on PYTHONPATH: the step's products as BLAS calls) and with this checkout's (inductor's
# decompose_mm_pass at batch 1), every architecture at size=small and size=base, 4096 tokens
# after a 128-token prompt, the median of 3 decodes.
#   bash experiments/decode_gemv_before_after/run.sh     # ~15 minutes on 2 cores
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../before_after.sh"  # code_of
for side in before after; do
  code="$(code_of "$side" f904391)"
  for size in small base; do
    PYTHONPATH="$code" mcsd-bench bench=cpu_quick model_size=$size compile=true "inference.batch_sizes=[1]" \
      "inference.gen_lengths=[4096]" inference.repeats=3 output_dir="$here/$side/$size" wandb.enabled=false
  done
done
