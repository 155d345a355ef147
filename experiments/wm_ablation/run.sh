#!/usr/bin/env bash
# The Wonderful Matrices ablation at CPU scale, one command:
#   1. the corpus split by lines as the architecture comparison does (the first 90% to train on);
#   2. experiment=wm_ablation: SSD only, + attention, + dynamic mask, + CDMoE, 2 seeds, 1M tokens
#      each (CSV logs copied here as every sweep.sh experiment);
#   3. the figure and tables of mcsd-plot ablation, each arm against SSD only, paired by seed.
#   bash experiments/wm_ablation/run.sh --replace CORPUS.txt logger=csv   # the committed results
#   bash experiments/wm_ablation/run.sh CORPUS.txt seed=0                 # a trial, under trial/
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../corpus_arguments.sh"  # [--replace|--add] [CORPUS.txt]: results_mode, results, name, split
"$here/../sweep.sh" wm_ablation ${results_mode[@]+"${results_mode[@]}"} --name "$name" "$split/train.txt" "$@"
