#!/usr/bin/env bash
# Fig. 9 at CPU scale: the ablation sweep, its CSV logs copied here, the figure and the
# per-seed table (paired against the Transformer).
#   bash experiments/fig9_ablation/run.sh embedded                     # embedded corpus, seed 0
#   bash experiments/fig9_ablation/run.sh embedded seed=0,1,2          # more seeds
#   bash experiments/fig9_ablation/run.sh tinyshakespeare seed=0,1
set -euo pipefail
exec "$(dirname "$0")/../sweep.sh" fig9_ablation "$@"
