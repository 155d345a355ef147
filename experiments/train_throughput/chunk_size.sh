#!/usr/bin/env bash
# Training throughput at several chunk sizes, chosen by measurement: untrained size=small models
# (ARCH at its configured chunk size, or ARCH:CHUNK at that one; --with OVERRIDE, before them, for
# every model) saved to logs/models beside OUT, then mcsd-bench mode=train on their chunkwise form.
#   experiments/train_throughput/chunk_size.sh OUT [--with OVERRIDE]... MODEL... -- [mcsd-bench overrides]
#   experiments/train_throughput/chunk_size.sh out mcsd:32 mcsd:64 -- bench=cpu_quick train.seq_lens=[1024]
#   experiments/train_throughput/chunk_size.sh out --with model.num_channels=16 gated_deltanet:16 -- bench=compare
set -euo pipefail
out="$1"; shift
shared=(); while [ "${1:-}" = --with ]; do shared+=("$2"); shift 2; done
specs=(); while [ $# -gt 0 ] && [ "$1" != -- ]; do specs+=("$1"); shift; done
[ $# -gt 0 ] && shift
here="$(cd "$(dirname "$out")" && pwd)"
models="$here/logs/models"; rm -rf "$models"; mkdir -p "$models"
python - "$models" "${shared[*]-}" "${specs[@]}" <<'PY'
import sys
import mcsd
from hydra import compose, initialize_config_module

shared = sys.argv[2].split()
for spec in sys.argv[3:]:
    name, _, chunk = spec.partition(":")
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        cfg = compose("train", overrides=[f"model={name}", "size=small", *shared,
                                          *([f"model.chunk_size={chunk}"] if chunk else [])])
    mcsd.save(mcsd.build_model(cfg.model), f"{sys.argv[1]}/{name}" + (f"_chunk{chunk}" if chunk else ""))
PY
list=$(for spec in "${specs[@]}"; do name="${spec%%:*}"; chunk="${spec#*:}"
       [ "$chunk" = "$spec" ] && echo "$models/$name" || echo "$models/${name}_chunk$chunk"; done | paste -sd, -)
mcsd-bench mode=train "models=[$list]" train.forms=[chunk] paths.log_dir="$here/logs" output_dir="$out" \
  wandb.enabled=false "$@"
