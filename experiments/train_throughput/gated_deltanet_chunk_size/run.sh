#!/usr/bin/env bash
# Gated DeltaNet's chunk size, chosen by measurement: a training step (forward, backward, AdamW) at
# size=small (width 128) in the chunkwise form for chunk sizes 8..64, with 4 heads (width 32 each:
# size=small, MQAR's grid) and with 16 (width 8: the retrieval and MAD grids), at the comparison's
# 16 x 256 tokens (bench=compare) and at 1 x 4096 (untrained models, saved to logs/ first).
#   bash experiments/train_throughput/gated_deltanet_chunk_size/run.sh     # ~8 minutes on 2 cores, alone
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
chunks=(gated_deltanet:8 gated_deltanet:16 gated_deltanet:32 gated_deltanet:64)
for heads in 4 16; do
  "$here/../chunk_size.sh" "$here/cpu_${heads}heads" --with "model.num_channels=$heads" "${chunks[@]}" -- \
    bench=compare overwrite=true
  "$here/../chunk_size.sh" "$here/cpu_${heads}heads/4096" --with "model.num_channels=$heads" "${chunks[@]}" -- \
    bench=cpu_quick "train.seq_lens=[4096]" overwrite=true
done
