#!/usr/bin/env bash
# The architecture comparison at CPU scale, one command:
#   1. the corpus split by lines: the first 90% to train on, the last 10% held out as probe documents;
#   2. experiment=compare_architectures: every registered architecture and variant, 2 seeds, 1M tokens
#      each (CSV logs and the training-curve figure copied here, as every sweep.sh experiment);
#   3. mcsd-probe context on every trained model (held-out documents of 4096 tokens);
#   4. mcsd-bench inference and train (bench=compare) on the trained models of the first seed;
#   5. mcsd-plot compare: the headline table, with MQAR from experiments/mqar_recall/cpu.
#   bash experiments/compare_architectures/run.sh --replace          # the committed results (~1 hour)
#   bash experiments/compare_architectures/run.sh                    # a trial, under trial/
#   bash experiments/compare_architectures/run.sh --replace CORPUS.txt seed=0,1,2
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../corpus_arguments.sh"  # [--replace] [CORPUS.txt]: replace, results, name, split

"$here/../sweep.sh" compare_architectures "ablation" ${replace[@]+"${replace[@]}"} --name "$name" "$split/train.txt" "$@"
sweep="$(ls -td "$here/logs/$name/train/multiruns/"*/ | head -n 1)"
out="$results/$name"
export OMP_NUM_THREADS=1
ls -d "$sweep"*/model | xargs -P 2 -I MODEL sh -c 'job=$(basename $(dirname MODEL)); mcsd-probe context \
  ckpt=MODEL data=text_files "data.paths=[$1]" length=4096 num_documents=8 num_positions=8 \
  paths.log_dir="$2/logs/$3" output_dir="$4/probe/$job" wandb.enabled=false > "$2/logs/$3/probe-$job.log" 2>&1' \
  _ "$split/held_out.txt" "$here" "$name" "$out"

first_seed=$(grep -h '^seed:' "$sweep"*/.hydra/config.yaml | sort -n -k2 | head -n 1 | cut -d' ' -f2)
models=$(for job in "$sweep"*/; do
  if grep -q "^seed: $first_seed$" "$job/.hydra/config.yaml"; then printf '%s,' "${job}model"; fi
done)
unset OMP_NUM_THREADS  # the benchmarks run alone, on every core
for mode in inference train; do
  mcsd-bench bench=compare mode=$mode "models=[${models%,}]" paths.log_dir="$here/logs/$name" \
    output_dir="$out/bench_$mode" wandb.enabled=false
done
mcsd-plot compare "$out" --mqar "$here/../mqar_recall/cpu"
