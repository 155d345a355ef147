#!/usr/bin/env bash
# Split a corpus by lines as the comparison and the studies on its models do: the first 90% to
# train on (SPLIT_DIR/train.txt), the last 10% held out (SPLIT_DIR/held_out.txt).
#   experiments/split_corpus.sh CORPUS.txt SPLIT_DIR
set -euo pipefail
corpus="$1"; split="$2"
[ -f "$corpus" ] || { echo "run.sh: error: corpus $corpus does not exist: give a .txt file" >&2; exit 2; }
mkdir -p "$split"
lines=$(wc -l < "$corpus"); train_lines=$(( lines * 9 / 10 ))
head -n "$train_lines" "$corpus" > "$split/train.txt"
tail -n +"$(( train_lines + 1 ))" "$corpus" > "$split/held_out.txt"
