#!/usr/bin/env bash
# Building a size=1.6b model on this CPU before and after the meta-device build (issue 54 item 3),
# side by side: each point in a fresh process (a process's first touch of fresh memory is slow on
# this machine, and it is paid by every point alike), the two sides and the reference (one normal_
# pass over as many values, in the same dtype) alternating within each round.
#   bash experiments/build_time_before_after/run.sh [ROUNDS]   # ~3 minutes a round
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../before_after.sh"  # code_of
out="$here/results.jsonl"
: > "$out"
for round in $(seq 1 "${1:-3}"); do
  for case in "mcsd float32" "transformer float32" "mcsd bfloat16"; do
    set -- $case
    for side in before after; do
      PYTHONPATH="$(code_of "$side" 5fee4d4)" python "$here/measure.py" build "$1" "$2" \
        | sed "s/^{/{\"round\": $round, \"side\": \"$side\", /" >> "$out"
    done
    python "$here/measure.py" normal "$1" "$2" | sed "s/^{/{\"round\": $round, \"side\": \"reference\", /" >> "$out"
  done
done
python - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print("| arch | dtype | params | before (s) | after (s) | normal_ (s) | after / normal_ | before / after |")
print("|---|---|---|---|---|---|---|---|")
for key in dict.fromkeys((row["arch"], row["dtype"]) for row in rows):
    times = {side: [row["seconds"] for row in rows if (row["arch"], row["dtype"]) == key and row["side"] == side]
             for side in ("before", "after", "reference")}
    med = {side: statistics.median(values) for side, values in times.items()}
    spread = {side: f"{min(values):.1f}-{max(values):.1f}" for side, values in times.items()}
    params = next(row["params"] for row in rows if (row["arch"], row["dtype"]) == key)
    print(f"| {key[0]} | {key[1]} | {params:,} | {med['before']:.1f} ({spread['before']}) | {med['after']:.1f} "
          f"({spread['after']}) | {med['reference']:.1f} ({spread['reference']}) | "
          f"{med['after'] / med['reference']:.2f} | {med['before'] / med['after']:.2f} |")
PY
