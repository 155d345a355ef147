#!/usr/bin/env bash
# Mamba-2's chunk size, chosen by measurement: a training step (forward, backward, AdamW) at
# size=small (width 128) in the chunkwise form for chunk sizes 16..128, with 4 heads and with 16
# (chunk_size_heads.sh; untrained models, saved to logs/ first).
#   bash experiments/train_throughput/mamba2_chunk_size/run.sh     # ~3 minutes on 2 cores, alone
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../chunk_size_heads.sh" "$here" mamba2 16 32 64 128
