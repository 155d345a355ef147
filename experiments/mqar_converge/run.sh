#!/usr/bin/env bash
# MQAR trained to a plateau at CPU scale (experiment=mqar_converge): the CSV logs copied here,
# the accuracy-vs-width and accuracy-vs-state figures and the table (best learning rate per point).
# The Transformer first (zoology's attention result is the anchor), then every other arm added:
#   bash experiments/mqar_converge/run.sh --replace --name cpu hydra.sweeper.registry_architectures=[transformer]
#   bash experiments/mqar_converge/run.sh --add --name cpu hydra.sweeper.registry_architectures=[mcsd]
set -euo pipefail
flags=()
if [ "${1:-}" = --replace ] || [ "${1:-}" = --add ]; then flags+=("$1"); shift; fi
if [ "${1:-}" = --name ]; then flags+=(--name "$2"); shift 2; fi
exec "$(dirname "$0")/../sweep.sh" mqar_converge ${flags[@]+"${flags[@]}"} own logger=csv \
  callbacks.progress_bar.refresh_rate=0 "$@"
