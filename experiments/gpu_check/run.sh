#!/usr/bin/env bash
# One command for a GPU machine that has CUDA and torch but not the project's other dependencies,
# offline (issue 55 item 4). On a machine with a package index, first fill the wheel folder:
#   python experiments/gpu_check/fill_wheels.py .whl        # Python 3.12, Linux x86_64 (see --help)
# then, in the checkout's root on the GPU machine:
#   bash experiments/gpu_check/run.sh [RESULTS=experiments/gpu_check/results]
# It installs the project from .whl (WHEELS=...) into /tmp/mcsd_site (SITE=...), with fla's kernels
# (the gpu extra), runs the GPU tests (pytest -m gpu tests/gpu: fla's kernels among them), the short
# paper grid (bench=paper_quick: 1.6B in bf16, the PyTorch forms and fla's kernels side by side,
# decoding through CUDA graphs, MCSD and the Transformer training at 32768 tokens a step) and draws
# the figures, every result in RESULTS:
#   device.txt, pytest_gpu.txt, inference/ and train/ (results.csv/.json, log.txt, figures).
# Each step has its own time limit (seconds, from the environment), 520 s in all by default, so the
# whole run ends within 9 minutes; the benchmarks write their results after every point, so a step
# cut short keeps what it measured. The exit status is the first failing step's.
set -uo pipefail
cd "$(dirname "$0")/../.."
results=${1:-experiments/gpu_check/results}
mkdir -p "$results"
status=0
step() {  # step NAME SECONDS LOG COMMAND...: run with a time limit, its output also into LOG
    local name=$1 seconds=$2 log=$3
    shift 3
    mkdir -p "$(dirname "$log")"
    echo "[$(date +%T)] $name (limit ${seconds}s): $*"
    timeout --kill-after=10 "$seconds" "$@" 2>&1 | tee "$log"
    local code=${PIPESTATUS[0]}
    echo "[$(date +%T)] $name: exit $code$([ $code -eq 124 ] && echo ' (time limit reached)')"
    [ $status -eq 0 ] && status=$code
    return 0
}

# python3 -P everywhere: the installed project, not the checkout's mcsd/ (which has no mcsd.conf: conf/
# is installed as that package).
source experiments/gpu_check/install.sh "${WHEELS:-.whl}" "${SITE:-/tmp/mcsd_site}" || exit 1
python3 -P - > "$results/device.txt" <<'PYTHON'
import platform, torch, mcsd
print(f"device: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device'}")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, Python {platform.python_version()}, mcsd from {mcsd.__file__}")
PYTHON
cat "$results/device.txt"

# pytest: 4 workers sharing the GPU and 120 s a test where the image has pytest-xdist and pytest-timeout (it
# has both); PYTEST_OPTIONS replaces these (PYTEST_OPTIONS="" runs the tests one after another, unlimited).
default_options=()
python3 -P -c "import xdist" 2>/dev/null && default_options+=(-n 4 --dist load)
python3 -P -c "import pytest_timeout" 2>/dev/null && default_options+=(--timeout=120)
if [ -n "${PYTEST_OPTIONS+set}" ]; then read -r -a pytest_options <<< "$PYTEST_OPTIONS"; else pytest_options=("${default_options[@]}"); fi
step "pytest -m gpu" "${PYTEST_S:-220}" "$results/pytest_gpu.txt" \
    python3 -P -m pytest -m gpu tests/gpu -p no:cacheprovider -v -o addopts="" --durations=10 \
    ${pytest_options[@]+"${pytest_options[@]}"}
# The benchmarks stop starting points 15 s before their step's limit (time_budget_s: each point's estimate from
# the latest point of its model), so they end by themselves with what they measured; their grids measure every
# pair the figures compare, the shortest lengths first.
inference_s=${INFERENCE_S:-140}
step "decoding (bench=paper_quick)" "$inference_s" "$results/inference/log.txt" \
    mcsd-bench bench=paper_quick wandb.enabled=false output_dir="$results/inference" time_budget_s=$((inference_s - 15))
# Training runs eagerly: a compile per point (a 1.6B model's forward and backward) would take the run's time. MCSD
# and the Transformer (TRAIN_MODELS), the pair issue 63's targets compare, at every length; models=null (every
# architecture, each with both kernels) is bench=paper_quick's own and takes longer than a step has.
train_s=${TRAIN_S:-130}
step "training (bench=paper_quick mode=train)" "$train_s" "$results/train/log.txt" \
    mcsd-bench bench=paper_quick mode=train "models=${TRAIN_MODELS:-[mcsd,transformer]}" compile=false \
    wandb.enabled=false output_dir="$results/train" time_budget_s=$((train_s - 15))
for mode in inference train; do
    if [ -f "$results/$mode/results.csv" ]; then
        step "figures ($mode)" 15 "$results/$mode/plot_log.txt" mcsd-plot "$mode" source="$results/$mode/results.csv"
    fi
done
exit $status
