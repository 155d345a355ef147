#!/usr/bin/env bash
# The CPU time of a training step with denormal floats computed (torch's default) and flushed to zero
# (mcsd-train's flush_denormal=true), side by side, for the needle's trained models of
# experiments/retrieval/four_rates (their runs are read from experiments/retrieval/logs/: run that sweep
# here first), each also freshly initialised as the control. A benchmark: run it alone on the machine.
#   bash experiments/denormals/run.sh            # writes experiments/denormals/cpu/results.csv
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../result_jobs.sh"
results="$here/../retrieval/four_rates"
runs=()
for job in $(result_jobs "$results"); do
  model="$(result_model "$results" "$job")"
  if [ -d "$model" ]; then runs+=("$(dirname "$model")"); fi
done
if (( ${#runs[@]} == 0 )); then
  echo "denormals/run.sh: no trained model of $results is on this machine (its runs' model/ folders): run" \
    "experiments/retrieval/run.sh --add --name four_rates task=needle ... first (experiments/retrieval/README.md)" >&2
  exit 2
fi
OMP_NUM_THREADS=1 python "$here/measure.py" "$here/cpu" "${runs[@]}" --repeats 5
