#!/usr/bin/env bash
# GLA's training speed before and after its chunk form went to sub-chunks (41e5c83), side by side in
# one run: the same mcsd-bench points with the code of 3443d25 (a worktree in /tmp, on PYTHONPATH) and
# with this checkout's, MCSD beside it as the reference (its code did not change). A training step
# (forward, backward, AdamW) of each training form: size=tiny at 16 x 256 tokens on 1 thread, and
# size=small at 16 x 256 and 1 x 4096 (2 threads).
#   bash experiments/gla_speed_before_after/run.sh     # ~6 minutes on 2 cores
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../before_after.sh"  # side_run
for side in before after; do
  common=(mode=train "models=[gla,mcsd]" "train.forms=[training]" memory_limit_mb=16000 wandb.enabled=false overwrite=true)
  side_run "$side" 3443d25 mcsd-bench bench=compare "${common[@]}" model_size=tiny threads=1 output_dir="$here/$side/tiny"
  side_run "$side" 3443d25 mcsd-bench bench=compare "${common[@]}" output_dir="$here/$side/small"
  side_run "$side" 3443d25 mcsd-bench bench=compare "${common[@]}" train.batch_size=1 "train.seq_lens=[4096]" \
    output_dir="$here/$side/small_4096"
done
