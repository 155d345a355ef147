"""The issue's four checks from run.sh's result files, into summary.json and data_pipeline.png.
    python summarize.py RESULTS
"""
import csv
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GB = 1e9


def step_seconds(metrics: Path) -> float:
    """The median training step time over the throughput monitor's windows after the first."""
    rows = list(csv.DictReader(metrics.open()))
    rates = [float(row["train/device/batches_per_sec"]) for row in rows if row.get("train/device/batches_per_sec")]
    return 1 / statistics.median(rates[1:])


def main(results: Path) -> None:
    read = {path.stem: json.loads(path.read_text()) for path in results.glob("*.json") if path.stem != "summary"}
    small, large = read["build-200m"], read["build-2g"]
    baseline, fast, mapped = read["encode-batch-2g"], read["encode-batch-fast-2g"], read["datasets-map-200m"]
    build_peak = {"200m": small["peak_pss_all_processes_bytes"], "2g": large["peak_pss_all_processes_bytes"]}
    train_peak = {size: read[f"train-{size}-memory"]["peak"] for size in ("200m", "2g")}
    step = step_seconds(results / "train-2g-metrics.csv")
    summary = {
        "tokenize_ratio_to_encode_batch": large["tokens_per_second"] / baseline["tokens_per_second"],
        "tokenize_ratio_to_encode_batch_fast": large["tokens_per_second"] / fast["tokens_per_second"],
        "tokenize_ratio_to_datasets_map_200m": small["tokens_per_second"] / mapped["tokens_per_second"],
        "build_peak_pss_bytes": build_peak,
        "build_peak_vmhwm_bound_bytes": {name: build["peak_main_bytes"] + build["num_proc"] * build["peak_worker_bytes"]
                                         for name, build in (("200m", small), ("2g", large))},
        "build_peak_ratio_2g_to_200m": build_peak["2g"] / build_peak["200m"],
        "train_peak_bytes": train_peak,
        "train_peak_ratio_2g_to_200m": train_peak["2g"] / train_peak["200m"],
        "train_step_seconds": step,
        "loading_seconds_per_batch": read["loading-2g"]["seconds_per_batch"],
        "loading_fraction_of_step": read["loading-2g"]["seconds_per_batch"] / step,
    }
    (results / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(10, 3.6))
    speed.bar(["encode_batch", "encode_batch\n_fast", "our build\n(num_proc=2)"],
              [run["tokens_per_second"] / 1e6 for run in (baseline, fast, large)], color=["gray", "silver", "tab:blue"])
    speed.set_ylabel("million tokens/s (2 GB corpus, 2 cores)")
    x = range(2)
    memory.bar([i - 0.2 for i in x], [build_peak[s] / GB for s in ("200m", "2g")], 0.4, label="build (PSS, all processes)")
    memory.bar([i + 0.2 for i in x], [train_peak[s] / GB for s in ("200m", "2g")], 0.4, label="training (size=small)")
    memory.set_xticks(list(x), ["200 MB corpus", "2 GB corpus"])
    memory.set_ylabel("peak resident memory (GB)")
    memory.legend(loc="lower center")
    fig.tight_layout()
    fig.savefig(results / "data_pipeline.png", dpi=120)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
