#!/usr/bin/env bash
# The multiple-temporal-perspectives recipe at CPU scale, one command:
#   1. the corpus split by lines as the architecture comparison does (the first 90% to train on);
#   2. RWKV-4 (P = 1) trained from scratch at size=small on 1M tokens (the comparison's setting);
#   3. experiment=rwkv_perspectives from it: only the mixes mu and W_agg trained, P = 1, 2, 3, 4,
#      on the same 400k tokens each (CSV logs copied here as every sweep.sh experiment);
#   4. the figure and tables of mcsd-plot ablation, each P against P = 1 paired by seed.
#   bash experiments/rwkv_perspectives/run.sh --replace CORPUS.txt logger=csv   # the committed results
#   bash experiments/rwkv_perspectives/run.sh CORPUS.txt seed=0,1               # a trial, under trial/
#   bash experiments/rwkv_perspectives/run.sh --replace --base RUN_DIR CORPUS.txt  # start from a trained RWKV-4
#     (the comparison's RWKV-4 of seed 0 is this base: same corpus split, size, tokens and seed)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
replace=(); given_base=""
if [ "${1:-}" = --replace ]; then replace=(--replace); shift; fi
if [ "${1:-}" = --base ]; then given_base="$(realpath "$2")"; shift 2; fi
source "$here/../corpus_path.sh"
if [ -z "${1:-}" ] || [[ "$1" == *=* ]]; then  # no corpus, or an override in its place
  corpus_usage "experiments/rwkv_perspectives/run.sh" "[--replace] [--base RUN_DIR] CORPUS [mcsd-train overrides...]"
fi
corpus="$(corpus_path "$1")"; shift
name="$(basename "${corpus%.*}")"
split="$here/logs/$name/split"; "$here/../split_corpus.sh" "$corpus" "$split"

base="${given_base:-$here/logs/$name/base}"
if [ -z "$given_base" ]; then
  rm -rf "$base"
  overrides=(); for override in "$@"; do [[ "$override" == seed=*,* ]] || overrides+=("$override"); done
  OMP_NUM_THREADS=2 mcsd-train model=rwkv4 size=small data=text_files "data.paths=[$split/train.txt]" \
    data.sample_by=paragraph data.seq_len=256 data.batch_size=16 data.token_budget=1000000 trainer.val_check_interval=50 \
    scheduler.warmup_steps=20 hydra.run.dir="$base" paths.log_dir="$here/logs/$name" ${overrides[@]+"${overrides[@]}"}
fi
"$here/../sweep.sh" rwkv_perspectives ${replace[@]+"${replace[@]}"} --name "$name" \
  "$split/train.txt" init_from="$base" "$@"
