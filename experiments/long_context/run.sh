#!/usr/bin/env bash
# The long-context probe, in detail, on the models experiments/compare_architectures trained
# (run that first: its models stay under compare_architectures/logs/<corpus>/): every model
# of its latest sweep probed on the held-out tenth of the corpus at 16 positions per document,
# then the figure of the key curves and of all of them.
#   bash experiments/long_context/run.sh --replace                       # the committed results
#   bash experiments/long_context/run.sh --replace CORPUS.txt length=2048 windows=[64,256,1024]
#   bash experiments/long_context/run.sh --add CORPUS.txt   # probe only the jobs the committed results lack
#     (a newly registered architecture's models), keep the rest, draw them all
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
results="$here/trial"; add=false
if [ "${1:-}" = --replace ]; then results="$here"; shift; elif [ "${1:-}" = --add ]; then results="$here"; add=true; shift; fi
corpus="${1:-$here/../../../shared/data/tinyshakespeare.txt}"; shift $(( $# < 1 ? $# : 1 ))
name="$(basename "${corpus%.*}")"
trained="$here/../compare_architectures/logs/$name"
[ -d "$trained/train/multiruns" ] || { echo "run.sh: error: no trained models under $trained: run" \
  "experiments/compare_architectures/run.sh $corpus first" >&2; exit 2; }
sweep="$(ls -td "$trained/train/multiruns/"*/ | head -n 1)"
out="$results/$name"; $add || rm -rf "${out:?}"; mkdir -p "$here/logs/$name"
export OMP_NUM_THREADS=1  # two probes side by side, one core each
for model in "$sweep"*/model; do [ -d "$out/$(basename "$(dirname "$model")")" ] || echo "$model"; done | xargs -P 2 -I MODEL sh -c 'held=$0 here=$1 name=$2 out=$3; shift 3
  job=$(basename $(dirname MODEL))
  mcsd-probe context ckpt=MODEL data=text_files "data.paths=[$held]" length=4096 num_documents=8 num_positions=16 \
    paths.log_dir="$here/logs/$name" output_dir="$out/$job" wandb.enabled=false "$@" > "$here/logs/$name/probe-$job.log" 2>&1' \
  "$trained/split/held_out.txt" "$here" "$name" "$out" "$@"
mcsd-plot context "$out" --curves "MCSD full,MCSD slope_only,MCSD decay_only,Transformer,RetNet,RWKV-4" --name context_probe
mcsd-plot context "$out" --name context_probe_all
