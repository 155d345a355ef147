"""Figures and tables of the synthetic instruments beside MQAR (``data=mad``, ``data=retrieval``):
each run's final test accuracy on its task, one panel per task; at the training length alone
(MAD: bars per architecture) or also past it (retrieval: accuracy against the test length, a
line per architecture). The decoding state each model keeps after a training-length sequence
is listed beside its accuracy (:func:`mcsd.plots.mqar.decoding_state_bytes`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from mcsd.checkpoint.run_folder import DIVERGED, METRICS_FILE, run_status  # noqa: E402
from mcsd.errors import MCSDError  # noqa: E402
from mcsd.markdown import markdown_table  # noqa: E402
from mcsd.plots.files import save_figure  # noqa: E402
from mcsd.plots.mqar import curve_colors, decoding_state_bytes  # noqa: E402
from mcsd.plots.rates import best_rates  # noqa: E402
from mcsd.plots.runs import arch_label, curve_key, curve_order, run_identity, run_logs, split_curve  # noqa: E402


@dataclass
class TaskFigure:
    """What :func:`plot_tasks` drew: the files and the table (a row per run and test length, every
    learning rate's: :func:`markdown_task_table` takes each point's best)."""

    paths: list[Path]
    table: pd.DataFrame


def load_task_runs(root: str | Path) -> pd.DataFrame:
    """One row per run and test length under ``root``: architecture, variant, task, the test
    length and accuracy there (``test/<task>_acc`` at the training length, ``..._at_<N>`` past
    it), the run's tokens, parameters and decoding-state bytes. A run that diverged (its
    ``result.json`` says so) has one row, at the training length, with no accuracy and the
    tokens of its sweep's finished runs of the task, so that its rate counts as tried and loses
    (:func:`best_task_rates`). Runs without a task's test accuracy otherwise (language models,
    MQAR, unfinished runs) are skipped."""
    records = []
    for run, config, metrics in run_logs(root):
        data = config.get("data") or {}
        task = data.get("task")
        diverged = task is not None and run_status(Path(root) / run / METRICS_FILE) == DIVERGED
        if task is None or (f"test/{task}_acc" not in metrics and not diverged):
            continue
        arch, variant = run_identity(config)
        seq_len = int(data["seq_len"])
        common = {"run": run, "arch": arch, "variant": variant, "task": task, "seed": config.get("seed"),
                  "lr": float((config.get("optimizer") or {}).get("lr", float("nan"))),
                  "trained_length": seq_len, "params": config.get("model/params"), "sweep": config.get("sweep"),
                  "tokens": float("nan") if diverged else float(metrics["trainer/tokens"].dropna().max()),
                  "state_bytes": decoding_state_bytes(config["model"], seq_len)}
        if diverged:
            records.append({**common, "length": seq_len, "accuracy": float("nan")})
            continue
        for name, length in [(f"test/{task}_acc", seq_len),
                             *((column, int(column.rsplit("_", 1)[1])) for column in metrics
                               if column.startswith(f"test/{task}_acc_at_"))]:
            records.append({**common, "length": length, "accuracy": float(metrics[name].dropna().iloc[-1])})
    if not records or all(pd.isna(record["tokens"]) for record in records):
        raise MCSDError(f"{root} holds no finished runs of data=mad or data=retrieval (no test/<task>_acc in "
                        "their logs): point it at an experiment=mad or experiment=retrieval sweep")
    rows = pd.DataFrame(records)
    # A diverged run would have trained on the budget of its sweep's other runs of the task.
    planned = rows.groupby(["sweep", "task"], dropna=False)["tokens"].transform("max")
    rows["tokens"] = rows["tokens"].fillna(planned)
    rows["curve"] = curve_key(rows["arch"], rows["variant"])
    return rows.drop(columns="sweep")


def best_task_rates(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of each (curve, task)'s best learning rate: the one of highest mean accuracy at the
    training length, rates compared on the seeds they share (:func:`mcsd.plots.rates.best_rates`,
    zoology's protocol, as MQAR's), with ``lrs_tried`` and ``at_edge`` (the best is the lowest or
    highest rate tried: the grid does not bracket it). Rates compete only between runs of the same
    training tokens (a rate sweep's): a folder of unlike runs (an anchor's budgets) keeps every run."""
    keys = ["curve", "task", "tokens"]
    trained = rows[rows["length"] == rows["trained_length"]]
    return rows.merge(best_rates(trained, keys, "accuracy", higher_is_better=True), on=[*keys, "lr"])


def _ordered_curves(rows: pd.DataFrame) -> list[str]:
    return sorted(rows["curve"].unique(), key=lambda key: curve_order("ablation", key))


def _label(curve: str) -> str:
    arch, variant = split_curve(curve)
    return arch_label(arch) if variant in ("default", "") else f"{arch_label(arch)} {variant}"


def markdown_task_table(rows: pd.DataFrame) -> str:
    """Accuracy per architecture (rows) and task (columns; a column per test length past the
    training one), the mean over seeds at each point's best learning rate (named, and starred at
    the grid's edge, where more than one was tried), with each model's decoding state at the
    training length."""
    rows = best_task_rates(rows)
    curves, tasks = _ordered_curves(rows), list(dict.fromkeys(rows.sort_values("task")["task"]))
    columns = [(task, length) for task in tasks for length in sorted(rows.loc[rows["task"] == task, "length"].unique())]
    trained = rows.groupby("task")["trained_length"].first()
    header = [task if length == trained[task] else f"{task} at {length}" for task, length in columns]
    accuracies = []
    for curve in curves:
        cells = [_label(curve)]
        for task, length in columns:
            point = rows[(rows["curve"] == curve) & (rows["task"] == task) & (rows["length"] == length)]
            rate = ("" if point.empty or point["lrs_tried"].iloc[0] < 2 or length != trained[task] else
                    f" (lr {point['lr'].iloc[0]:g}{'*' if point['at_edge'].iloc[0] else ''})")
            accuracy = "-" if point.empty else "diverged" if point["accuracy"].isna().all() else f"{point['accuracy'].mean():.3f}"
            cells.append(f"{accuracy}{rate}")
        accuracies.append(cells)
    lines = [markdown_table(["architecture", *header], accuracies)]
    if rows["at_edge"].any():
        lines += ["", "\\* the best of the rates tried is the lowest or the highest of them: the grid does not "
                  "bracket it, and a wider one may find more."]
    state = rows.drop_duplicates(["curve", "task"]).pivot(index="curve", columns="task", values="state_bytes")
    lines += ["", "Decoding state per sequence after the training length (KiB, fp32):", "",
              markdown_table(["architecture", *tasks],
                             [[_label(curve), *("-" if task not in state.columns or pd.isna(state.loc[curve, task])
                                                  else f"{state.loc[curve, task] / 1024:,.1f}" for task in tasks)]
                              for curve in curves])]
    return "\n".join(lines) + "\n"


def plot_tasks(rows: pd.DataFrame, output_dir: str | Path, name: str) -> TaskFigure:
    """One panel per task: bars of each architecture's test accuracy (a task tested at its
    training length alone) or its accuracy against the test length (a line each, the training
    length dotted), each at its best learning rate, coloured as the rates figure; where several were
    tried, also accuracy against the rate (``<name>_rates.png/.pdf``). Writes ``<name>.png/.pdf``
    and ``<name>_table.md``."""
    every_rate, rows = rows, best_task_rates(rows)
    tasks, curves = sorted(rows["task"].unique()), _ordered_curves(rows)
    columns = min(3, len(tasks))
    lines = -(-len(tasks) // columns)
    figure, axes = plt.subplots(lines, columns, figsize=(4.8 * columns, 3.8 * lines), squeeze=False)
    colors = curve_colors(curves)
    for ax, task in zip(axes.flat, tasks):
        own = rows[rows["task"] == task]
        lengths = sorted(own["length"].unique())
        for index, curve in enumerate(curves):
            points = own[own["curve"] == curve].groupby("length")["accuracy"].mean()
            if points.empty:
                continue
            if len(lengths) == 1:
                ax.bar(index, points.iloc[0], color=colors[curve], label=_label(curve))
            else:
                ax.plot(points.index, points.values, marker="o", color=colors[curve], label=_label(curve))
        if len(lengths) == 1:
            ax.set_xticks([])
        else:
            ax.axvline(own["trained_length"].iloc[0], color="0.5", linestyle=":", linewidth=1)
            ax.set_xlabel("test length (tokens; dotted: trained at)")
        ax.set(title=task.replace("_", " "), ylim=(0, 1.02), ylabel="test accuracy")
        ax.grid(True, axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(tasks):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, bbox_to_anchor=(0.5, -0.02))
    figure.suptitle(f"{name.replace('_', ' ')}: final test accuracy per task (mean over seeds)")
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    output_dir = Path(output_dir)
    paths = save_figure(figure, output_dir, name)
    if (rows["lrs_tried"] > 1).any():
        paths += plot_task_rates(every_rate, output_dir, f"{name}_rates")
    table = output_dir / f"{name}_table.md"
    table.write_text(markdown_task_table(every_rate))
    return TaskFigure([*paths, table], every_rate)


def plot_task_rates(rows: pd.DataFrame, output_dir: str | Path, name: str) -> list[Path]:
    """One panel per task: test accuracy at the training length against the learning rate (log
    axis), mean over seeds, a line per curve (an architecture's default in its colour, each other
    variant one of its own: :func:`mcsd.plots.mqar.curve_colors`), a rate that diverged a cross at 0.
    Writes ``<name>.png/.pdf``."""
    trained = rows[rows["length"] == rows["trained_length"]]
    tasks, curves = sorted(trained["task"].unique()), _ordered_curves(trained)
    columns = min(3, len(tasks))
    figure, axes = plt.subplots(-(-len(tasks) // columns), columns, figsize=(4.8 * columns, 3.8 * -(-len(tasks) // columns)),
                                squeeze=False, sharey=True, layout="constrained")
    colors = curve_colors(curves)
    for ax, task in zip(axes.flat, tasks):
        for curve in curves:
            points = trained[(trained["task"] == task) & (trained["curve"] == curve)].groupby("lr")["accuracy"].mean()
            color = colors[curve]
            if not points.empty:
                ax.plot(points.index, points.values, marker="o", color=color, label=_label(curve))
                diverged = points.index[points.isna()]
                ax.plot(diverged, [0.0] * len(diverged), marker="x", linestyle="none", color=color)
        ax.set(xscale="log", title=task.replace("_", " "), ylim=(-0.02, 1.02), xlabel="learning rate",
               ylabel="test accuracy")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(tasks):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    figure.suptitle(f"{name.replace('_', ' ')}: test accuracy against learning rate (mean over seeds; x: diverged)")
    return save_figure(figure, output_dir, name)
