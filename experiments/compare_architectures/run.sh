#!/usr/bin/env bash
# The architecture comparison at CPU scale, one command:
#   1. the corpus split by lines: the first 90% to train on, the last 10% held out as probe documents;
#   2. experiment=compare_architectures: every registered architecture and variant, 2 seeds, 1M tokens
#      each (CSV logs and the training-curve figure copied here, as every sweep.sh experiment);
#   3. mcsd-probe context on every trained model that has no probe yet (held-out documents of 4096 tokens);
#   4. mcsd-bench inference and train (bench=compare) on the models of the first seed, side by side (each
#      built from its run's logged config with random weights: speed and state do not depend on weights);
#   5. mcsd-plot compare: the headline table, with MQAR from experiments/mqar_converge/cpu (trained to a plateau).
#   bash experiments/compare_architectures/run.sh --replace tinyshakespeare   # the committed results (~1 hour)
#   bash experiments/compare_architectures/run.sh tinyshakespeare            # a trial, under trial/
#   bash experiments/compare_architectures/run.sh --replace CORPUS.txt seed=0,1,2
#   bash experiments/compare_architectures/run.sh --add CORPUS.txt hydra.sweeper.registry_architectures=[NAME]
#     (a newly registered architecture: trains and probes only its arms, keeps the committed jobs, and
#     benchmarks every first-seed model again so that the speeds stay side by side)
#   bash experiments/compare_architectures/run.sh --bench CORPUS
#     (the committed jobs' benchmarks and table again, nothing trained: e.g. after a change to bench=compare)
#   bash experiments/compare_architectures/run.sh --no-bench --add CORPUS hydra.sweeper.params.seed=0 ...
#     (train and probe, then the table, without benchmarking: more learning rates of models already benchmarked,
#     whose speed and state do not change with the rate)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bench_only=false; bench=true
if [ "${1:-}" = --bench ]; then bench_only=true; shift; set -- --replace "$@"; fi
if [ "${1:-}" = --no-bench ]; then bench=false; shift; fi
source "$here/../corpus_arguments.sh"  # [--replace|--add] [CORPUS.txt]: results_mode, results, name, split
out="$results/$name"

source "$here/../result_jobs.sh"  # result_jobs, result_model, best_rate_jobs, bench_jobs
status=0
if ! $bench_only; then
  # A job that diverged or was refused (status 1 or 2: sweep.sh has copied and drawn the others; a rate sweep's
  # highest rate may diverge) does not stop the probes and the table of the jobs that trained; run.sh ends with it.
  "$here/../sweep.sh" compare_architectures ${results_mode[@]+"${results_mode[@]}"} --name "$name" \
    "$split/train.txt" "$@" || status=$?
  (( status == 0 || status == 1 || status == 2 )) || exit "$status"
  [ -n "$(result_jobs "$out" 2>/dev/null)" ] || exit "$status"  # no job trained, here or before: nothing to probe
  export OMP_NUM_THREADS=1
  # The probes of each row's best learning rate (every job where each row ran at one rate) that have none yet
  # (xargs -r: no probe at all where every one is there, as after a sweep whose one job diverged).
  for job in $(best_rate_jobs "$out"); do [ -d "$out/probe/$job" ] || echo "$job $(result_model "$out" "$job")"; done | \
    xargs -r -P 2 -L 1 sh -c 'mcsd-probe context ckpt="$6" data=text_files "data.paths=[$1]" length=4096 num_documents=8 \
    num_positions=8 paths.log_dir="$2/logs/$3" output_dir="$4/probe/$5" wandb.enabled=false > "$2/logs/$3/probe-$5.log" 2>&1' \
    _ "$split/held_out.txt" "$here" "$name" "$out"  # then each line's job number and model
fi

if $bench; then
  models=$(for job in $(bench_jobs "$out"); do printf '%s,' "$out/$job/csv/version_0/hparams.yaml"; done)
  unset OMP_NUM_THREADS  # the benchmarks run alone, on every core
  for mode in inference train; do
    mcsd-bench bench=compare mode=$mode "models=[${models%,}]" paths.log_dir="$here/logs/$name" \
      output_dir="$out/bench_$mode" overwrite=true wandb.enabled=false  # every model again, side by side
  done
fi
mcsd-plot experiment source="$out" name=compare_architectures  # the table and figure, MQAR from ../mqar_converge/cpu
exit "$status"
