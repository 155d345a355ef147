#!/usr/bin/env bash
# The data pipeline on a generated 2 GB corpus and a 200 MB one (make_corpus.py): build time and
# memory (num_proc=2), tokens/s beside tokenizers' own encode_batch and encode_batch_fast with 2
# threads on the same text and beside datasets.map(num_proc=2), the peak memory of a size=small
# training run on each corpus, and the time to load a batch.
#   bash experiments/data_pipeline/run.sh [--replace]      # ~45 minutes on 2 cores, 6 GB of disk
# Results go to trial/, or with --replace to results/ (the committed ones). The corpora and caches
# are written to $WORK (default /tmp/mcsd-data-pipeline) and left there.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export RESULTS="$here/trial"; if [ "${1:-}" = --replace ]; then export RESULTS="$here/results"; fi
work="${WORK:-/tmp/mcsd-data-pipeline}"
mkdir -p "$work" "$RESULTS"
[ -d "$work/corpus-200m" ] || python "$here/make_corpus.py" "$work/corpus-200m" 2e8 --files 1
[ -d "$work/corpus-2g" ] || python "$here/make_corpus.py" "$work/corpus-2g" 2e9 --files 8
for size in 200m 2g; do  # the BPE on its 100 MB sample, then the shards
  rm -rf "$work/cache-$size"
  python "$here/bench.py" build "build-$size" "$work/corpus-$size" "$work/cache-$size" --num-proc 2
done
tokenizer=$(ls "$work"/cache-2g/files-*/tokenizer-*.json)
python "$here/bench.py" encode_batch encode-batch-2g "$work/corpus-2g" "$tokenizer" --threads 2
python "$here/bench.py" encode_batch encode-batch-fast-2g "$work/corpus-2g" "$tokenizer" --threads 2 --fast
python "$here/bench.py" datasets_map datasets-map-200m "$work/corpus-200m" "$tokenizer" --num-proc 2
for size in 200m 2g; do  # training reads the shards the build wrote
  rm -rf "$work/train-$size"
  mcsd-train size=small data=text_files "data.paths=[$(ls "$work"/corpus-$size/*.jsonl | paste -sd, -)]" \
    paths.cache_dir="$work/cache-$size" trainer.max_steps=40 logger=csv validate_before_training=false \
    test_after_training=false trainer.limit_val_batches=0 callbacks.model_checkpoint=null \
    callbacks.final_model=null paths.log_dir="$work/logs" hydra.run.dir="$work/train-$size"
  cp "$work/train-$size/memory/process-0.json" "$RESULTS/train-$size-memory.json"
  cp "$work/train-$size/csv/version_0/metrics.csv" "$RESULTS/train-$size-metrics.csv"
done
python "$here/bench.py" loading loading-2g "$work/cache-2g" "$work/corpus-2g" --batches 500
python "$here/summarize.py" "$RESULTS"
