#!/usr/bin/env bash
# MCSD's chunk size, chosen by measurement: a training step (forward, backward, AdamW) of
# batch 1 x 1024..16384 tokens at size=small in the chunkwise form for chunk sizes 16..256
# (untrained models, saved to logs/ first), with mcsd-bench bench=cpu_quick mode=train.
#   bash experiments/train_throughput/mcsd_chunk_size/run.sh     # ~5 minutes on 2 cores
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../chunk_size.sh" "$here/cpu" mcsd:16 mcsd:32 mcsd:64 mcsd:128 mcsd:256 -- bench=cpu_quick \
  "train.seq_lens=[1024,4096,16384]"
