"""Read the runs of run.sh (one folder each) into results.csv and distributed_training.png:
training tokens/s (median of the 10-step windows after the first) and each process's memory plan
beside its measured peak.
    python summarize.py RESULTS_FOLDER
"""
import csv
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RUNS = ["one_process_1_thread", "one_process_2_threads", "ddp_2_processes", "fsdp_2_processes"]
GIB = 2**30


def tokens_per_second(run: Path) -> tuple[float, list[float]]:
    """Per process tokens/s: the median of the throughput monitor's windows, the first (warm-up) left out."""
    rows = list(csv.DictReader((run / "csv/version_0/metrics.csv").open()))
    windows = [float(r["train/device/items_per_sec"]) for r in rows if r.get("train/device/items_per_sec")]
    return statistics.median(windows[1:]), windows


def main(results: Path) -> None:
    table = []
    for name in RUNS:
        run = results / name
        per_process, windows = tokens_per_second(run)
        memory = [json.loads(p.read_text()) for p in sorted((run / "memory").glob("process-*.json"))]
        processes = memory[0]["processes"]
        for record in memory:
            table.append({
                "run": name, "processes": processes, "rank": record["rank"],
                "tokens_per_sec": round(per_process * processes), "tokens_per_sec_per_process": round(per_process),
                "windows": " ".join(f"{w:.0f}" for w in windows),
                "planned_gib": round(record["planned"] / GIB, 3), "peak_gib": round(record["peak"] / GIB, 3),
                "plan_over_peak": round(record["planned"] / record["peak"], 3),
                **{f"{part}_gib": round(record[part] / GIB, 3)
                   for part in ("parameters", "gradients", "optimizer", "gathered", "activations", "runtime")},
            })
    with (results / "results.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    first = [row for row in table if row["rank"] == 0]
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [row["run"].replace("_", " ") for row in first]
    speed.barh(labels, [row["tokens_per_sec"] for row in first], color="tab:blue")
    speed.set_xlabel("training tokens/s (all processes)")
    speed.invert_yaxis()
    rows = [row for row in table]
    names = [f"{row['run'].replace('_', ' ')} #{row['rank']}" for row in rows]
    y = range(len(rows))
    memory.barh([i - 0.2 for i in y], [row["planned_gib"] for row in rows], height=0.4, label="plan")
    memory.barh([i + 0.2 for i in y], [row["peak_gib"] for row in rows], height=0.4, label="measured peak (VmHWM)")
    memory.set_yticks(list(y), names)
    memory.set_xlabel("memory per process (GiB)")
    memory.invert_yaxis()
    memory.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    fig.suptitle("size=base (6.6M parameters), global batch 32 x 256 tokens, CPU")
    fig.tight_layout()
    fig.savefig(results / "distributed_training.png", dpi=120)
    for row in table:
        print(f"{row['run']:24s} rank {row['rank']}: {row['tokens_per_sec']:6d} tokens/s, plan {row['planned_gib']:.2f} "
              f"GiB, peak {row['peak_gib']:.2f} GiB ({row['plan_over_peak']:.2f})")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
