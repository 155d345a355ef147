#!/usr/bin/env bash
# MQAR at CPU scale: architectures x width x (T, K) x learning rate, the CSV logs copied here,
# the accuracy-vs-width figure and its table (best learning rate per point).
#   bash experiments/mqar_recall/run.sh --replace --name cpu           # the committed results (12 jobs per arm)
#   bash experiments/mqar_recall/run.sh --add --name cpu hydra.sweeper.registry_architectures=[retnet]
#                                                          # one more architecture's 12 jobs, kept beside the rest
#   bash experiments/mqar_recall/run.sh --name all hydra.sweeper.registry_variants=[all]
set -euo pipefail
flags=()
if [ "${1:-}" = --replace ] || [ "${1:-}" = --add ]; then flags+=("$1"); shift; fi
if [ "${1:-}" = --name ]; then flags+=(--name "$2"); shift 2; fi
exec "$(dirname "$0")/../sweep.sh" mqar_recall ${flags[@]+"${flags[@]}"} own "$@"
