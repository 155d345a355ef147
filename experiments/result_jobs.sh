# Sourced by run.sh scripts: the jobs of a results folder as sweep.sh writes it
# (RESULTS/<job>/csv/version_0/hparams.yaml, each a copy of its run's config).
#   result_jobs RESULTS             the job numbers
#   result_model RESULTS JOB        where the job's run saved its trained model (model_checkpoint's dirpath)
#   first_seed_jobs RESULTS         the jobs of the smallest seed
#   best_rate_jobs RESULTS          the jobs of each model's learning rate of lowest validation perplexity (every job
#                                   where each model ran at one rate: mcsd.plots.compare.best_rate_jobs)
#   bench_jobs RESULTS              of those, the first of each model (a rate sweep trains one model at several rates;
#                                   a benchmark builds it with random weights, so one job stands for them all)
result_jobs() { for job in "$1"/*/; do job="$(basename "$job")"; if [[ "$job" =~ ^[0-9]+$ ]]; then echo "$job"; fi; done; }
result_model() { sed -n 's|^ *dirpath: \(.*/model\)$|\1|p' "$1/$2/csv/version_0/hparams.yaml"; }
result_seed() { sed -n 's/^seed: //p' "$1/$2/csv/version_0/hparams.yaml"; }
first_seed_jobs() {
  local first; first=$(for job in $(result_jobs "$1"); do result_seed "$1" "$job"; done | sort -n | head -n 1)
  for job in $(result_jobs "$1"); do if [ "$(result_seed "$1" "$job")" = "$first" ]; then echo "$job"; fi; done
}
model_node() { awk '/^model:/ { inside = 1; print; next } /^[^ ]/ { inside = 0 } inside' "$1/$2/csv/version_0/hparams.yaml"; }
bench_jobs() {
  local seen="" job digest
  for job in $(first_seed_jobs "$1"); do
    digest="$(model_node "$1" "$job" | md5sum | cut -c1-32)"
    case " $seen " in *" $digest "*) ;; *) seen+=" $digest"; echo "$job" ;; esac
  done
}
best_rate_jobs() { python -c 'import sys; from mcsd.plots.compare import best_rate_jobs; print(*best_rate_jobs(sys.argv[1]))' "$1"; }
