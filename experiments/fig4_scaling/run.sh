#!/usr/bin/env bash
# Fig. 4 at CPU scale: the scaling sweep (tiny, small, base; MCSD and Transformer), its CSV
# logs copied here, and the figure.
#   bash experiments/fig4_scaling/run.sh embedded                      # embedded corpus, seed 0
#   bash experiments/fig4_scaling/run.sh tinyshakespeare
set -euo pipefail
exec "$(dirname "$0")/../sweep.sh" fig4_scaling "$@"
