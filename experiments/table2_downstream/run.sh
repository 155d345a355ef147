#!/usr/bin/env bash
# Table 2: 5-shot ARC-C, ARC-E, WinoGrande, MMLU and HellaSwag of a trained model.
#   bash experiments/table2_downstream/run.sh [--replace] RUN_DIR [NAME] [mcsd-eval overrides]
# The results land in experiments/table2_downstream/trial/NAME/, or with --replace in
# experiments/table2_downstream/NAME/ (the committed ones): results.json, table2.md.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
results=trial; if [ "${1:-}" = --replace ]; then results=.; shift; fi
run="$1"; name="${2:-$(basename "$run")}"; shift $(( $# < 2 ? $# : 2 ))
mcsd-eval ckpt="$run" tasks=table2 output_dir="$here/$results/$name" "$@"
