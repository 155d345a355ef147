#!/usr/bin/env bash
# MAD's six tasks at CPU scale: every registered architecture x task (conf/experiment/mad.yaml),
# two jobs at a time, the CSV logs copied here, the accuracy figure and table drawn.
#   bash experiments/mad/run.sh --replace --name cpu                     # the committed results
#   bash experiments/mad/run.sh --name anchor hydra.sweeper.params.task=in_context_recall \
#     hydra.sweeper.registry_architectures=[transformer]                # attention on recall alone
#   bash experiments/mad/run.sh --replace --resume --name cpu           # go on after Ctrl-C
set -euo pipefail
flags=()
while [[ "${1:-}" == --* ]]; do
  if [ "$1" = --name ]; then flags+=(--name "$2"); shift 2; else flags+=("$1"); shift; fi
done
exec "$(dirname "$0")/../sweep.sh" mad ${flags[@]+"${flags[@]}"} own "$@"
