#!/usr/bin/env bash
# The decay-initialisation study at CPU scale: the sweep, its CSV logs copied here, the figure
# and the per-seed table (paired against the Transformer).
#   bash experiments/decay_init_study/run.sh embedded seed=0,1,2
#   bash experiments/decay_init_study/run.sh tinyshakespeare seed=0,1,2
set -euo pipefail
exec "$(dirname "$0")/../sweep.sh" decay_init_study "$@"
