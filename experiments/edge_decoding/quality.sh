#!/usr/bin/env bash
# Issue 67 item 1: what quantized weights cost in quality. MCSD and the Transformer trained as
# experiment=mcsd_vs_transformer on a corpus's first 90% of lines (split_corpus.sh), at size=small and
# size=base, two jobs at a time; then each scored by mcsd-eval on the held-out last 10% (a
# rolling-perplexity task, one document per paragraph) with weights=full, int8 and int4; the table.
#   bash experiments/edge_decoding/quality.sh --replace tinyshakespeare    # quality/ (committed)
#   bash experiments/edge_decoding/quality.sh tinyshakespeare              # a trial, under trial/quality/
#   SIZES=small bash experiments/edge_decoding/quality.sh CORPUS.txt       # one size
# Extra arguments are mcsd-train overrides of every job.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../corpus_arguments.sh"  # [--replace] CORPUS: results, name, split
out="$results/quality"
tasks="$here/logs/$name/held_out_task"
mkdir -p "$tasks"
python - "$split/held_out.txt" "$tasks" <<'PY'
import json, sys
from pathlib import Path
import yaml
held_out, tasks = Path(sys.argv[1]), Path(sys.argv[2])
paragraphs = [part.strip() for part in held_out.read_text().split("\n\n") if part.strip()]
(tasks / "held_out.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in paragraphs))
(tasks / "held_out_ppl.yaml").write_text(yaml.safe_dump({
    "task": "held_out_ppl", "dataset_path": "json",
    "dataset_kwargs": {"data_files": {"test": str(tasks / "held_out.jsonl")}}, "test_split": "test",
    "output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{text}}",
    "metric_list": [{"metric": "word_perplexity", "aggregation": "weighted_perplexity", "higher_is_better": False}],
    "metadata": {"version": 1.0}}, sort_keys=False))
print(f"held-out task: {len(paragraphs)} paragraphs of {held_out}")
PY
export OMP_NUM_THREADS=1  # two jobs side by side, one core each
sweep="$here/logs/$name/train/multiruns/quality-$(date +%Y-%m-%d_%H-%M-%S)"
mcsd-train -m experiment=mcsd_vs_transformer data=text_files "data.paths=[$split/train.txt]" \
  data.sample_by=paragraph "size=${SIZES:-small,base}" hydra/launcher=local_parallel \
  paths.log_dir="$here/logs/$name" hydra.sweep.dir="$sweep" logger=csv callbacks.progress_bar.refresh_rate=0 "$@"
# each job's scores in quality/<size>-<model>/: a run of one size replaces that size's only
for job in "$sweep"/*/; do
  [ -d "$job/model" ] || continue
  scores="$out/$(sed -n 's/^- size=//p' "$job/.hydra/overrides.yaml")-$(sed -n 's/^- model=//p' "$job/.hydra/overrides.yaml")"
  rm -rf "$scores"; mkdir -p "$scores"
  for weights in full int8 int4; do echo "$job $weights $scores/$weights"; done
done | xargs -r -P 2 -L 1 sh -c 'mkdir -p "$(dirname "$5")"; mcsd-eval ckpt="$3" "tasks=[held_out_ppl]" include_path="$2" \
  weights="$4" wandb.enabled=false paths.log_dir="$1" output_dir="$5" > "$5.log" 2>&1 \
  || { echo "mcsd-eval failed: $5.log" >&2; exit 255; }' _ "$here/logs/$name" "$tasks"  # then each line: job, weights, folder
python - "$out" <<'PY'
import json, sys
from pathlib import Path
import mcsd
from mcsd.models import registry
out = Path(sys.argv[1])
rows = []
for job in (path for path in out.iterdir() if path.is_dir()):  # quality/<size>-<model>/
    scores = {weights: json.loads((job / weights / "results.json").read_text()) for weights in ("full", "int8", "int4")}
    run = Path(scores["full"]["config"]["ckpt"])  # the training job's run folder
    model = mcsd.load(run)
    size = next(line.split("=", 1)[1] for line in (run / ".hydra" / "overrides.yaml").read_text().splitlines()
                if line.startswith("- size="))
    ppl = {weights: content["results"]["held_out_ppl"]["token_perplexity,none"] for weights, content in scores.items()}
    params = sum(p.numel() for p in model.parameters())
    rows.append((params, f"| {registry.of_config(model.config).label} | {size} | {params:,} | "
                f"{ppl['full']:.3f} | {ppl['int8']:.3f} ({100 * (ppl['int8'] / ppl['full'] - 1):+.2f}%) | "
                f"{ppl['int4']:.3f} ({100 * (ppl['int4'] / ppl['full'] - 1):+.2f}%) | {run.parent.name}/{run.name} |"))
table = ("| model | size | params | held-out ppl, full | int8, bfloat16 (vs full) | int4, bfloat16 (vs full) | training run |\n"
         "| --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(row for _, row in sorted(rows)) + "\n")
(out / "quality_table.md").write_text(table)
print(table)
PY
