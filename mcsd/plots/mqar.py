"""MQAR figure and table: accuracy vs model width, one panel per (T, K), one line per
architecture (and variant), each point at its best learning rate (zoology's protocol).

A point's accuracy is the final ``val/mqar_acc`` of its run, averaged over seeds; the best
learning rate is the one with the highest such mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import pandas as pd  # noqa: E402

from mcsd.errors import MCSDError  # noqa: E402
from mcsd.models import registry  # noqa: E402
from mcsd.plots.files import save_figure  # noqa: E402
from mcsd.plots.runs import curve_label, curve_order, run_identity, run_logs  # noqa: E402

ACCURACY = "val/mqar_acc"


@dataclass
class MQARFigure:
    """What :func:`plot_mqar` drew: the files, the curve labels (legend order) and the table."""

    paths: list[Path]
    labels: list[str]
    table: pd.DataFrame


def load_mqar_runs(root: str | Path) -> pd.DataFrame:
    """One row per MQAR run under ``root``: its curve, width, (T, K), learning rate, seed and
    final accuracy. Runs that logged no ``val/mqar_acc`` (language-model runs) are skipped."""
    records = []
    for run, config, metrics in run_logs(root):
        if ACCURACY not in metrics or metrics[ACCURACY].dropna().empty:
            continue
        arch, variant = run_identity(config)
        model, data = config.get("model") or {}, config.get("data") or {}
        records.append({"run": run, "curve": f"{arch}|{variant}", "width": int(model["hidden_size"]),
                        "seq_len": int(data["seq_len"]), "num_pairs": int(data["num_pairs"]),
                        "lr": float((config.get("optimizer") or {})["lr"]), "seed": config.get("seed"),
                        "params": config.get("model/params"), "accuracy": float(metrics[ACCURACY].dropna().iloc[-1])})
    if not records:
        raise MCSDError(f"{root} holds no MQAR runs (no {ACCURACY} in its logs): point it at an "
                        "experiment=mqar_recall sweep")
    return pd.DataFrame(records)


def best_learning_rate(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (curve, T, K, width): the learning rate of highest mean accuracy over seeds, that
    accuracy, its min and max over seeds, and the number of seeds and learning rates tried."""
    by_lr = (runs.groupby(["curve", "seq_len", "num_pairs", "width", "lr"])["accuracy"]
             .agg(["mean", "min", "max", "count"]).reset_index())
    best = by_lr.loc[by_lr.groupby(["curve", "seq_len", "num_pairs", "width"])["mean"].idxmax()].copy()
    best["lrs_tried"] = by_lr.groupby(["curve", "seq_len", "num_pairs", "width"])["lr"].count().to_numpy()
    best["label"] = [curve_label("ablation", curve, None) for curve in best["curve"]]
    best["order"] = [curve_order("ablation", curve) for curve in best["curve"]]
    best = best.rename(columns={"mean": "accuracy", "min": "accuracy_min", "max": "accuracy_max", "count": "seeds"})
    return best.sort_values(["order", "width", "seq_len"]).drop(columns="order").reset_index(drop=True)


def markdown_mqar_table(best: pd.DataFrame) -> str:
    """Rows: curve and width; columns: each (T, K), as ``accuracy (lr)``."""
    settings = sorted({(row.seq_len, row.num_pairs) for row in best.itertuples()})
    header = ["curve", "width", *(f"T={t}, K={k}" for t, k in settings)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for (label, width), group in best.groupby(["label", "width"], sort=False):
        cells = [label, str(width)]
        for t, k in settings:
            point = group[(group["seq_len"] == t) & (group["num_pairs"] == k)]
            cells.append(f"{point['accuracy'].iloc[0]:.3f} (lr {point['lr'].iloc[0]:g})" if len(point) else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_mqar(runs: pd.DataFrame, output_dir: str | Path, name: str = "mqar_recall") -> MQARFigure:
    """Accuracy vs width (log2 axis) per (T, K), best learning rate per point, min-max over
    seeds as error bars; writes ``<name>.png/.pdf`` and ``<name>_table.md``."""
    best = best_learning_rate(runs)
    settings = sorted({(row.seq_len, row.num_pairs) for row in best.itertuples()})
    curves = list(dict.fromkeys(best["curve"]))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    figure, axes = plt.subplots(1, len(settings), figsize=(4.6 * len(settings), 4), squeeze=False, sharey=True)
    labels = []
    for index, curve in enumerate(curves):
        arch = curve.split("|", 1)[0]
        points = best[best["curve"] == curve]
        label = points["label"].iloc[0]
        labels.append(label)
        first_variant = arch in registry.architectures() and curve_order("ablation", curve)[2] == 0
        color = registry.get(arch).color if first_variant else colors[(index + 3) % len(colors)]
        for ax, (t, k) in zip(axes[0], settings):
            point = points[(points["seq_len"] == t) & (points["num_pairs"] == k)].sort_values("width")
            ax.errorbar(point["width"], point["accuracy"], marker="o", color=color, label=label, capsize=3,
                        yerr=[point["accuracy"] - point["accuracy_min"], point["accuracy_max"] - point["accuracy"]])
    for ax, (t, k) in zip(axes[0], settings):
        ax.set(xscale="log", xlabel="model width", title=f"T = {t}, K = {k}", ylim=(-0.02, 1.02))
        ax.set_xticks(sorted(best["width"].unique()), [str(w) for w in sorted(best["width"].unique())])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("MQAR accuracy (best lr)")
    axes[0][-1].legend(fontsize=8)
    seeds = int(best["seeds"].max())
    figure.suptitle(f"MQAR: accuracy vs width (best of {int(best['lrs_tried'].max())} learning rates; "
                    f"{seeds} seed{'s' if seeds > 1 else ''})")
    paths = save_figure(figure, output_dir, name)
    paths.append(Path(output_dir) / f"{name}_table.md")
    paths[-1].write_text(markdown_mqar_table(best))
    return MQARFigure(paths=paths, labels=labels, table=best)
