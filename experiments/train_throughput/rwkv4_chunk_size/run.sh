#!/usr/bin/env bash
# RWKV-4's chunk size, chosen by measurement: a training step (forward, backward, AdamW) of
# 16 x 256 tokens at size=small in the chunkwise form for chunk sizes 4..32, beside MCSD
# (untrained models, saved to logs/ first), with mcsd-bench bench=compare mode=train.
#   bash experiments/train_throughput/rwkv4_chunk_size/run.sh     # ~3 minutes on 2 cores
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../chunk_size.sh" "$here/cpu" mcsd rwkv4:4 rwkv4:8 rwkv4:16 rwkv4:32 -- bench=compare
