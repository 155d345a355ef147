#!/usr/bin/env bash
# Documents joined or apart in a packed block (data.documents, issue 65), two settings, one command:
#   1. the main job (experiment=documents_apart: MCSD and the Transformer as experiment=mcsd_vs_transformer
#      trains them) with each setting: <corpus>/ here;
#   2. Fig. 9's setting (experiment=fig9_ablation: the five MCSD variants and the Transformer) with each:
#      experiments/fig9_ablation/documents_<corpus>/.
# Each figure and table pairs every curve with the Transformer of the same setting and seed.
#   bash experiments/documents_apart/run.sh --replace embedded logger=csv   # the committed results
#   bash experiments/documents_apart/run.sh embedded                        # a trial, under trial/
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
replace=(); if [ "${1:-}" = --replace ]; then replace=(--replace); shift; fi
corpus="${1:-}"
if [ -z "$corpus" ] || [[ "$corpus" == *=* ]]; then  # no corpus, or an override in its place
  source "$here/../corpus_path.sh"
  corpus_usage "experiments/documents_apart/run.sh" "[--replace] CORPUS [mcsd-train overrides...]"
fi
shift
"$here/../sweep.sh" documents_apart ${replace[@]+"${replace[@]}"} "$corpus" "$@"
"$here/../sweep.sh" fig9_ablation ${replace[@]+"${replace[@]}"} --name "documents_$(basename "${corpus%.*}")" "$corpus" \
  data.documents=joined,apart "$@"
