"""Table 2 of the paper (5-shot downstream accuracy) with our models' rows beside it."""

from __future__ import annotations

from typing import Any

from mcsd.markdown import markdown_table

TABLE2_TASKS = ["arc_challenge", "arc_easy", "winogrande", "mmlu", "hellaswag"]
COLUMNS = {"arc_challenge": "ARC-C", "arc_easy": "ARC-E", "winogrande": "WinoGrande", "mmlu": "MMLU",
           "hellaswag": "HellaSwag"}
# acc_norm where lm-eval reports it (length-normalised choice), acc otherwise.
METRICS = {"arc_challenge": "acc_norm", "arc_easy": "acc_norm", "winogrande": "acc", "mmlu": "acc",
           "hellaswag": "acc_norm"}
# Quoted from the paper's Table 2 (5-shot accuracy, %): not measured here.
PAPER_ROWS = [
    ("Llama3", "8B", [79.6, 92.3, 67.1, 66.3, 69.5], 75.0),
    ("Pythia", "2.8B", [32.9, 64.1, 59.7, 26.8, 59.3], 48.6),
    ("Mamba", "2.8B", [36.3, 69.7, 63.5, 26.2, 66.1], 52.4),
    ("RWKV4", "3B", [33.1, 67.8, 59.6, 25.6, 59.6], 49.1),
    ("MCSD", "3B", [36.8, 70.2, 63.8, 29.3, 67.2], 53.5),
]


def task_score(results: dict[str, Any], task: str) -> float | None:
    """Our accuracy (%) on ``task`` from lm-eval's results, or None if it was not run."""
    metrics = results.get(task)
    if not metrics:
        return None
    for metric in (METRICS[task], "acc"):
        value = metrics.get(f"{metric},none")
        if value is not None:
            return 100.0 * float(value)
    return None


def _size(params: int) -> str:
    return f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.1f}M"


def table2_markdown(rows: list[tuple[str, int, dict[str, Any]]]) -> str:
    """The paper's Table 2 layout: the quoted rows, then one row per (label, params, lm-eval
    ``results``) of ours. Tasks not run show as "-"; the average is over the five tasks and
    only given when all five were run."""
    table = [[f"{name} (quoted from the paper)", size, *(f"{score:.1f}" for score in scores), f"{average:.1f}"]
             for name, size, scores, average in PAPER_ROWS]
    for label, params, results in rows:
        scores = [task_score(results, task) for task in TABLE2_TASKS]
        average = "-" if None in scores else f"{sum(scores) / len(scores):.1f}"
        table.append([f"**{label}** (ours, measured)", _size(params),
                      *("-" if score is None else f"{score:.1f}" for score in scores), average])
    metrics = ", ".join(f"{COLUMNS[task]} {metric}" for task, metric in METRICS.items())
    return markdown_table(["Model type", "Model size", *COLUMNS.values(), "Average"], table) + f"\n\nQuoted rows: the paper's Table 2, 5-shot. Our metrics: {metrics}.\n"
