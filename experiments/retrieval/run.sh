#!/usr/bin/env bash
# Retrieval past the training length at CPU scale: every registered architecture x task
# (conf/experiment/retrieval.yaml), two jobs at a time, the CSV logs copied here, the figure drawn.
#   bash experiments/retrieval/run.sh --replace --name cpu               # the committed results
#   bash experiments/retrieval/run.sh --name anchor hydra.sweeper.params.task=passkey \
#     hydra.sweeper.registry_architectures=[transformer]                # attention on the passkey alone
#   bash experiments/retrieval/run.sh --replace --resume --name cpu           # go on after Ctrl-C
set -euo pipefail
flags=()
while [[ "${1:-}" == --* ]]; do
  if [ "$1" = --name ]; then flags+=(--name "$2"); shift 2; else flags+=("$1"); shift; fi
done
exec "$(dirname "$0")/../sweep.sh" retrieval ${flags[@]+"${flags[@]}"} own "$@"
