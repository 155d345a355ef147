#!/usr/bin/env bash
# Fig. 4 at CPU scale: the scaling sweep (tiny, small, base; MCSD and Transformer), its CSV
# logs copied here, and the figure.
#   bash experiments/fig4_scaling/run.sh                               # embedded corpus, seed 0
#   bash experiments/fig4_scaling/run.sh ../shared/data/tinyshakespeare.txt
set -euo pipefail
exec "$(dirname "$0")/../sweep.sh" fig4_scaling "$@"
