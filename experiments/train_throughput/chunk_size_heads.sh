#!/usr/bin/env bash
# A chunk size measured at two head widths: chunk_size.sh for ARCH at each CHUNK, with 4 heads (width 32 each:
# size=small, MQAR's grid) and with 16 (width 8: the retrieval and MAD grids), at the comparison's 16 x 256
# tokens (bench=compare) and at 1 x 4096, into OUT/cpu_<heads>heads[/4096].
#   experiments/train_throughput/chunk_size_heads.sh OUT ARCH CHUNK...
#   experiments/train_throughput/chunk_size_heads.sh experiments/train_throughput/gla_chunk_size gla 16 32 64
set -euo pipefail
out="$1"; arch="$2"; shift 2
specs=(); for chunk in "$@"; do specs+=("$arch:$chunk"); done
here="$(cd "$(dirname "$0")" && pwd)"
for heads in 4 16; do
  "$here/chunk_size.sh" "$out/cpu_${heads}heads" --with "model.num_channels=$heads" "${specs[@]}" -- \
    bench=compare overwrite=true
  "$here/chunk_size.sh" "$out/cpu_${heads}heads/4096" --with "model.num_channels=$heads" "${specs[@]}" -- \
    bench=cpu_quick "train.seq_lens=[4096]" overwrite=true
done
