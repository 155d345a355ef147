#!/usr/bin/env bash
# RWKV-4's chunk size, chosen by measurement: a training step (forward, backward, AdamW) of
# 16 x 256 tokens at size=small in the chunkwise form for chunk sizes 8..64, beside MCSD
# (untrained models, saved to logs/ first), with mcsd-bench bench=compare mode=train.
#   bash experiments/train_throughput/rwkv4_chunk_size/run.sh     # ~3 minutes on 2 cores
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
models="$here/logs/models"; rm -rf "$models"; mkdir -p "$models"
python - "$models" <<'PY'
import sys
import mcsd
from hydra import compose, initialize_config_module

for name, chunk in [("mcsd", None), *(("rwkv4", size) for size in (8, 16, 32, 64))]:
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        cfg = compose("train", overrides=[f"model={name}", "size=small",
                                          *([f"model.chunk_size={chunk}"] if chunk else [])])
    mcsd.save(mcsd.build_model(cfg.model), f"{sys.argv[1]}/{name}" + (f"_chunk{chunk}" if chunk else ""))
PY
list=$(ls -d "$models"/* | paste -sd, -)
mcsd-bench bench=compare mode=train "models=[$list]" train.forms=[chunk] paths.log_dir="$here/logs" \
  output_dir="$here/cpu" wandb.enabled=false
