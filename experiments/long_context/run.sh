#!/usr/bin/env bash
# The long-context probe, in detail, on the models experiments/compare_architectures trained
# (run that first: its models stay under compare_architectures/logs/<corpus>/): every job of its
# results (compare_architectures/<corpus>/) at each model's best learning rate probed on the held-out tenth of the
# corpus at 16 positions per document,
# then the figure of the key curves and of all of them.
#   bash experiments/long_context/run.sh --replace tinyshakespeare       # the committed results
#   bash experiments/long_context/run.sh --replace CORPUS.txt length=2048 windows=[64,256,1024]
#   bash experiments/long_context/run.sh --add CORPUS.txt   # probe only the jobs the committed results lack
#     (a newly registered architecture's models), keep the rest, draw them all
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
results="$here/trial"; add=false
if [ "${1:-}" = --replace ]; then results="$here"; shift; elif [ "${1:-}" = --add ]; then results="$here"; add=true; shift; fi
source "$here/../corpus_path.sh"
if [ -z "${1:-}" ] || [[ "$1" == *=* ]]; then  # no corpus, or an override in its place
  corpus_usage "experiments/long_context/run.sh" "[--replace|--add] CORPUS [mcsd-probe overrides...]"
fi
corpus="$(corpus_path "$1")"; shift
name="$(basename "${corpus%.*}")"
compared="$here/../compare_architectures/$name"  # the comparison's results: its jobs, and where it saved their models
trained="$here/../compare_architectures/logs/$name"
source "$here/../result_jobs.sh"  # best_rate_jobs (each model at its best learning rate), result_model
out="$results/$name"
for job in $(best_rate_jobs "$compared"); do  # before anything is removed: every model to probe is here
  if $add && [ -d "$out/$job" ]; then continue; fi
  [ -d "$(result_model "$compared" "$job")" ] || { echo "run.sh: error: the comparison's job $job has no trained" \
    "model here ($(result_model "$compared" "$job")): run experiments/compare_architectures/run.sh --replace" \
    "$corpus first" >&2; exit 2; }
done
$add || rm -rf "${out:?}"; mkdir -p "$here/logs/$name"
export OMP_NUM_THREADS=1  # two probes side by side, one core each
for job in $(best_rate_jobs "$compared"); do [ -d "$out/$job" ] || echo "$job $(result_model "$compared" "$job")"; done |
  xargs -r -P 2 -L 1 bash -c 'held=$1 here=$2 name=$3 out=$4 job="${@: -2:1}" model="${@: -1}"
  mcsd-probe context ckpt="$model" data=text_files "data.paths=[$held]" length=4096 num_documents=8 num_positions=16 \
    paths.log_dir="$here/logs/$name" output_dir="$out/$job" wandb.enabled=false "${@:5:$#-6}" > "$here/logs/$name/probe-$job.log" 2>&1' \
  _ "$trained/split/held_out.txt" "$here" "$name" "$out" "$@"  # then each line's job number and model
mcsd-plot experiment source="$out" name=long_context  # context_probe (the main curves) and context_probe_all
