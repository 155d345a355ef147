#!/usr/bin/env bash
# Training on 1 and 2 CPU processes at size=base: one process (1 and 2 threads), DDP and FSDP2
# (2 processes, 1 thread each), the same global batch (32 x 256 tokens) and steps; tokens/s from
# each run's metrics.csv, each process's memory plan beside its measured peak (memory/*.json).
#   bash experiments/distributed_training/run.sh [--replace] [mcsd-train overrides...]   # ~20 minutes
# Results go to trial/, or with --replace to this folder's committed results.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
results="$here/trial"; if [ "${1:-}" = --replace ]; then results="$here"; shift; fi
steps=40
run() {  # NAME THREADS OVERRIDES...
  local name="$1" threads="$2"; shift 2
  rm -rf "${results:?}/$name"
  OMP_NUM_THREADS="$threads" mcsd-train size=base data=embedded trainer.max_steps="$steps" logger=csv \
    validate_before_training=false test_after_training=false trainer.limit_val_batches=0 \
    callbacks.model_checkpoint=null callbacks.final_model=null \
    paths.log_dir="$here/logs" hydra.run.dir="$results/$name" "$@" "${extra[@]}"
}
extra=("$@")
run one_process_1_thread 1 trainer=cpu data.batch_size=32
run one_process_2_threads 2 trainer=cpu data.batch_size=32
run ddp_2_processes 1 trainer=ddp trainer.devices=2 trainer.accelerator=cpu data.batch_size=16
run fsdp_2_processes 1 trainer=fsdp trainer.devices=2 trainer.accelerator=cpu data.batch_size=16
python "$here/summarize.py" "$results"
