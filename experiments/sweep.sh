#!/usr/bin/env bash
# Run an experiment's sweep two jobs at a time, keep its CSV logs in the experiment's
# folder (<experiment>/<corpus>/<job>/csv/version_0/{metrics.csv,hparams.yaml}) and draw it.
#   experiments/sweep.sh EXPERIMENT [--replace|--add] [--resume] [--name NAME] embedded|tinyshakespeare|FILE.txt|own \
#     [mcsd-train overrides...]
# Each job's result.json (how it ended) is kept beside its csv/ folder.
# The figures and tables are drawn by `mcsd-plot experiment` (mcsd/plots/experiments.py: the same
# code as the figures notebook's).
# The results go to <experiment>/trial/<corpus>/, or with --replace to <experiment>/<corpus>/
# (the committed results), so that a trial run never overwrites them silently; --add writes
# to the committed results too but keeps the jobs already there, numbering the new ones after
# them (one more architecture's arms, hydra.sweeper.registry_architectures=[NAME]); --name NAME
# puts them in <NAME>/ instead of <corpus>/ (another sweep on the same corpus). `own` keeps the
# experiment's own data config (MQAR's synthetic examples) and names the folder `own` unless --name.
# --resume goes on with the latest sweep of the same experiment and name (one stopped by Ctrl-C),
# given the same arguments: its jobs run again in their own folders, so an interrupted job goes on
# from its checkpoint, a finished one only tests and saves again, and the jobs never begun begin.
set -euo pipefail
experiment="$1"; shift
results=trial; add=false; resume=false; folder=""
while true; do
  case "${1:-}" in
    --replace) results=.; shift ;;
    --add) results=.; add=true; shift ;;
    --resume) resume=true; shift ;;
    --name) folder="$2"; shift 2 ;;
    *) break ;;
  esac
done
source "$(dirname "$0")/corpus_path.sh"
corpus="${1:-}"
if [ -z "$corpus" ] || [[ "$corpus" == *=* ]]; then  # no corpus, or an override in its place
  corpus_usage "experiments/$experiment/run.sh" "[--replace|--add] [--name NAME] CORPUS [mcsd-train overrides...]"
fi
shift
here="$(cd "$(dirname "$0")" && pwd)/$experiment"
if [ "$corpus" = embedded ]; then
  data=(data=embedded); name=embedded
elif [ "$corpus" = own ]; then
  data=(); name=own
else
  # A .txt file is one document: its paragraphs are the documents that validation holds out whole.
  corpus="$(corpus_path "$corpus")"
  data=(data=text_files "data.paths=[$corpus]"); name="$(basename "${corpus%.*}")"
  [[ "$corpus" == *.txt ]] && data+=(data.sample_by=paragraph)
fi
name="${folder:-$name}"
export OMP_NUM_THREADS=1  # two jobs side by side, one core each
# The sweep's own folder, named here, so that two sweeps of one experiment at once each copy their own jobs.
sweep="$here/logs/$name/train/multiruns/$(date +%Y-%m-%d_%H-%M-%S)-$$/"
if $resume; then
  sweep="$(ls -d "$here/logs/$name/train/multiruns/"*/ 2>/dev/null | sort | tail -n 1)"
  if [ -z "$sweep" ]; then
    echo "sweep.sh: --resume: no sweep of $experiment under $here/logs/$name to go on with: run it without --resume" >&2
    exit 2
  fi
  echo "sweep.sh: going on with $sweep" >&2
fi
# Stopped (Ctrl-C, or SIGTERM to this script), the sweep stops every process it started: each
# training job stops after its step under way with a checkpoint (resume=RUN_DIR), then this script.
descendants() {  # every process below $1 but the subshell that asks
  local child; for child in $(pgrep -P "$1"); do [ "$child" = "$BASHPID" ] || { descendants "$child"; echo "$child"; }; done
}
stop() {
  trap '' INT TERM
  local processes alive
  processes="$(descendants $$)"  # the tree as it is now: mcsd-train, its job workers, their helpers
  [ -n "$processes" ] && kill -TERM $processes 2>/dev/null
  for _ in $(seq 120); do  # each job saves its checkpoint, then its worker ends
    alive=""; for process in $processes; do kill -0 "$process" 2>/dev/null && alive+=" $process"; done
    [ -z "$alive" ] && break; sleep 0.5
  done
  [ -n "$alive" ] && kill -KILL $alive 2>/dev/null
  echo "sweep.sh: stopped by $1: every job of the sweep stopped (its runs in $sweep); no results copied;" \
    "go on with it: the same command with --resume" >&2
  exit 130
}
trap 'stop Ctrl-C' INT; trap 'stop SIGTERM' TERM
mcsd-train -m experiment="$experiment" ${data[@]+"${data[@]}"} hydra/launcher=local_parallel \
  paths.log_dir="$here/logs/$name" hydra.sweep.dir="$sweep" "$@" &
status=0; wait $! || status=$?
trap - INT TERM
# A job that diverged, was refused or failed ends the sweep with status 1 or 2 once every other job has run
# (its summary says which): what the jobs logged is still copied and drawn, and the script ends with that status.
(( status == 0 || status == 1 || status == 2 )) || exit "$status"
if (( status != 0 )) && ! compgen -G "$sweep[0-9]*/" > /dev/null; then exit "$status"; fi  # no job ran: nothing to copy
out="$here/$results/$name"
first=0
if $add; then
  for kept in "$out"/*/; do
    number="$(basename "$kept")"
    if [[ "$number" =~ ^[0-9]+$ ]] && (( number >= first )); then first=$(( number + 1 )); fi
  done
else
  rm -rf "${out:?}"
fi
for job in "$sweep"*/; do
  logs="$job/csv/version_0"
  [ -f "$logs/metrics.csv" ] || continue
  copy="$out/$(( first + $(basename "$job") ))/csv/version_0"
  mkdir -p "$copy"
  cp "$logs/metrics.csv" "$logs/hparams.yaml" "$copy/"
  # How the job ended (a diverged job's rate counts as tried, at the worst score), beside its csv/.
  if [ -f "$job/result.json" ]; then cp "$job/result.json" "$copy/../../"; fi
done
mcsd-plot experiment source="$out" name="$experiment"
exit "$status"
