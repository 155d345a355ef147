"""MQAR figures and table: accuracy vs model width, accuracy vs the bytes of one
sequence's decoding state (zoology's and Based's recall / state-size trade-off) and accuracy vs
learning rate (whether the grid brackets each best), one panel per (T, K), one line per architecture (and variant), each point at its best learning rate
(zoology's protocol).

A point's accuracy is the final ``val/mqar_acc`` of its run, averaged over seeds; the best
learning rate is the one with the highest such mean. A point's state is what ``mcsd-bench``
reports as ``state_bytes_per_sequence``: every tensor of the decoding state after the T tokens
of an example, fp32 (a recurrent model's fixed state; attention's KV cache of T positions).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.colors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from mcsd.bench.decoding import state_bytes  # noqa: E402
from mcsd.checkpoint.run_folder import DIVERGED, METRICS_FILE, run_status  # noqa: E402
from mcsd.errors import MCSDError  # noqa: E402
from mcsd.markdown import markdown_table  # noqa: E402
from mcsd.models import registry  # noqa: E402
from mcsd.plots.style import architecture_color, architecture_colors  # noqa: E402
from mcsd.models.build import build_model  # noqa: E402
from mcsd.plots.files import save_figure  # noqa: E402
from mcsd.plots.runs import curve_key, curve_label, curve_order, run_identity, run_logs, split_curve  # noqa: E402
from mcsd.plots.rates import best_rates  # noqa: E402

ACCURACY = "val/mqar_acc"
SOLVED = 0.99  # zoology's bar for "solves MQAR"


@dataclass
class MQARFigure:
    """What :func:`plot_mqar` drew: the files, the curve labels (legend order) and the table."""

    paths: list[Path]
    labels: list[str]
    table: pd.DataFrame


def decoding_state_bytes(model_node: dict[str, Any], seq_len: int) -> int:
    """Bytes of one sequence's fp32 decoding state after ``seq_len`` tokens, for the model a run's
    logged ``model`` node describes (the bench's ``state_bytes_per_sequence``)."""
    return _state_bytes(json.dumps(model_node, sort_keys=True), seq_len)


@functools.lru_cache(maxsize=None)
def _state_bytes(model_json: str, seq_len: int) -> int:
    # On the meta device: the state's shapes without its values (a third of the time of a real
    # prefill, every architecture's bytes the same).
    with torch.device("meta"), torch.inference_mode():
        _, state = build_model(json.loads(model_json)).eval().prefill(torch.zeros(1, seq_len, dtype=torch.long))
    return state_bytes(state)


def load_mqar_runs(root: str | Path) -> pd.DataFrame:
    """One row per MQAR run under ``root``: its curve, width, (T, K), learning rate, seed and
    final accuracy. Runs that logged no ``val/mqar_acc`` (language-model runs) are skipped; a run
    that diverged (its ``result.json`` says so) has no final accuracy (its last validation came
    before the divergence) and stopped ``diverged``: its rate loses to every rate that trained."""
    records = []
    for run, config, metrics in run_logs(root):
        if ACCURACY not in metrics or metrics[ACCURACY].dropna().empty:
            continue
        course = run_course(config, metrics)
        diverged = run_status(Path(root) / run / METRICS_FILE) == DIVERGED
        arch, variant = run_identity(config)
        model, data = config.get("model") or {}, config.get("data") or {}
        records.append({"run": run, "curve": curve_key(arch, variant), "width": int(model["hidden_size"]),
                        "seq_len": int(data["seq_len"]), "num_pairs": int(data["num_pairs"]),
                        "lr": float((config.get("optimizer") or {})["lr"]), "seed": config.get("seed"),
                        "params": config.get("model/params"),
                        "accuracy": float("nan") if diverged else float(metrics[ACCURACY].dropna().iloc[-1]),
                        "state_bytes": decoding_state_bytes(model, int(data["seq_len"])),
                        **course, **({"stopped": DIVERGED} if diverged else {})})
    if not records:
        raise MCSDError(f"{root} holds no MQAR runs (no {ACCURACY} in its logs): point it at an "
                        "experiment=mqar_recall sweep")
    return pd.DataFrame(records)


def run_course(config: dict[str, Any], metrics: pd.DataFrame) -> dict[str, Any]:
    """How a run went: its validations after training began (``epochs`` when validated once an
    epoch), the tokens and examples it trained on, its training loss (the mean of those logged
    in its last epoch) beside its final validation loss (a gap between them: the training
    examples memorised rather than recall learned), its best accuracy, the first validation at
    :data:`SOLVED` or above, and why it stopped: ``plateau`` (its early stopping's rule held at
    some validation: no rise above ``min_delta`` in ``patience`` validations; the stop then comes
    at ``trainer.min_epochs`` at the earliest; under ``PlateauStopping``, at a validation from
    ``trainer.min_epochs`` on), ``cap`` (the epoch cap),
    ``max_epochs``, ``budget`` (a run with no early stopping: its steps or epochs) or
    ``unfinished`` (none of these: interrupted)."""
    validations = metrics.dropna(subset=[ACCURACY])
    trained = validations[validations["step"] > 0]
    accuracies = trained[ACCURACY].astype(float).tolist()
    tokens = int(trained["trainer/tokens"].iloc[-1]) if len(trained) and "trainer/tokens" in trained else 0
    callbacks = config.get("callbacks") or {}
    stopping, cap = callbacks.get("early_stopping"), (callbacks.get("epoch_cap") or {}).get("epochs")
    max_epochs = (config.get("trainer") or {}).get("max_epochs")
    stopped = "budget" if stopping is None else "unfinished"
    if stopping is not None:
        # Lightning's EarlyStopping, mode max: once signalled, the stop stands (it takes effect at
        # min_epochs); PlateauStopping drops a signal given before min_epochs (the count goes on).
        waits = str(stopping.get("_target_", "")).endswith("PlateauStopping")
        min_epochs = int((config.get("trainer") or {}).get("min_epochs") or 0)
        best, waited, plateaued = float("-inf"), 0, False
        for epoch, accuracy in enumerate(accuracies, start=1):
            best, waited = (accuracy, 0) if accuracy - float(stopping["min_delta"]) > best else (best, waited + 1)
            plateaued = plateaued or (waited >= int(stopping["patience"]) and (not waits or epoch >= min_epochs))
        if plateaued:
            stopped = "plateau"
        elif cap is not None and len(accuracies) >= int(cap):
            stopped = "cap"
        elif max_epochs is not None and len(accuracies) >= int(max_epochs):
            stopped = "max_epochs"
    solved = [index + 1 for index, accuracy in enumerate(accuracies) if accuracy >= SOLVED]
    losses = metrics.dropna(subset=["train/loss"]) if "train/loss" in metrics else metrics.iloc[:0]
    train_loss = float(losses[losses["epoch"] == losses["epoch"].max()]["train/loss"].mean()) if len(losses) else float("nan")
    val_loss = float(trained["val/loss"].iloc[-1]) if len(trained) and "val/loss" in trained else float("nan")
    return {"epochs": len(accuracies), "train_loss": train_loss, "val_loss": val_loss, "tokens": tokens, "examples": tokens // int((config.get("data") or {})["seq_len"]),
            "best_accuracy": max(accuracies, default=float("nan")), "first_solved": solved[0] if solved else None,
            "stopped": stopped}


def markdown_mqar_runs(runs: pd.DataFrame) -> str:
    """Every run: its curve, width, (T, K), learning rate, epochs, examples and tokens trained on,
    its last epoch's training loss beside its final validation loss, final and best accuracy, the
    first epoch at :data:`SOLVED` and why it stopped."""
    header = ["curve", "width", "(T, K)", "lr", "epochs", "examples", "tokens", "train loss", "val loss", "final", "best",
              f"first >= {SOLVED}", "stopped"]
    order = runs.assign(order=[curve_order("ablation", curve) for curve in runs["curve"]])
    rows = [[curve_label("ablation", row.curve, None), row.width, f"({row.seq_len}, {row.num_pairs})", f"{row.lr:g}",
             row.epochs, f"{row.examples:,}", f"{row.tokens:,}", f"{row.train_loss:.2f}", f"{row.val_loss:.2f}",
             "-" if pd.isna(row.accuracy) else f"{row.accuracy:.3f}", f"{row.best_accuracy:.3f}",
             "-" if pd.isna(row.first_solved) else str(int(row.first_solved)), row.stopped]
            for row in order.sort_values(["order", "width", "seq_len", "lr", "seed"]).itertuples()]
    return markdown_table(header, rows) + "\n"


def best_learning_rate(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (curve, T, K, width): the learning rate of highest mean accuracy, rates compared on the
    seeds they share (:func:`mcsd.plots.rates.best_rates`); that rate's accuracy, its min and max
    over all its seeds, the number of seeds and learning rates tried, and ``at_edge``."""
    keys = ["curve", "seq_len", "num_pairs", "width"]
    by_lr = (runs.groupby([*keys, "lr"])
             .agg(mean=("accuracy", "mean"), min=("accuracy", "min"), max=("accuracy", "max"),
                  count=("accuracy", "size"), state_bytes=("state_bytes", "first")).reset_index())
    best = by_lr.merge(best_rates(runs, keys, "accuracy", higher_is_better=True), on=[*keys, "lr"])
    best["label"] = [curve_label("ablation", curve, None) for curve in best["curve"]]
    best["order"] = [curve_order("ablation", curve) for curve in best["curve"]]
    best = best.rename(columns={"mean": "accuracy", "min": "accuracy_min", "max": "accuracy_max", "count": "seeds"})
    return best.sort_values(["order", "width", "seq_len"]).drop(columns="order").reset_index(drop=True)


def markdown_mqar_table(best: pd.DataFrame) -> str:
    """Rows: curve and width; columns: each (T, K), as ``accuracy (lr)``, the rate starred where it is
    the lowest or highest of those tried (not bracketed by the grid)."""
    settings = sorted({(row.seq_len, row.num_pairs) for row in best.itertuples()})
    header = ["curve", "width", *(f"T={t}, K={k}" for t, k in settings)]
    rows = []
    for (label, width), group in best.groupby(["label", "width"], sort=False):
        cells = [label, str(width)]
        for t, k in settings:
            point = group[(group["seq_len"] == t) & (group["num_pairs"] == k)]
            edge = "*" if len(point) and point["at_edge"].iloc[0] else ""
            accuracy = "diverged" if len(point) and pd.isna(point["accuracy"].iloc[0]) else (
                f"{point['accuracy'].iloc[0]:.3f}" if len(point) else "")
            cells.append(f"{accuracy} (lr {point['lr'].iloc[0]:g}{edge})" if len(point) else "")
        rows.append(cells)
    lines = [markdown_table(header, rows)]
    if best["at_edge"].any():
        lines.append("\n\\* the best of the rates tried is the lowest or the highest of them: the grid does not "
                     "bracket it, and a wider one may find more.")
    return "\n".join(lines) + "\n"


def curve_colors(curves: list[str]) -> dict[str, str]:
    """Each curve's colour: an architecture's default variant, no setting changed, its colour
    (:mod:`mcsd.plots.style`), as has an architecture's only curve (the hybrid run with
    ``attention_every=2`` at small sizes stays the hybrid's colour); any other curve (another
    variant, or a setting changed: ``default, rope=False``) the next colour of matplotlib's cycle
    that no built-in architecture and no architecture of these curves uses, then the lighter shades
    of tab20."""
    taken = architecture_colors({split_curve(curve)[0] for curve in curves})
    lighter = [matplotlib.colors.to_hex(color) for color in plt.get_cmap("tab20").colors[1::2]]  # after the cycle's
    spare = [color for color in [*plt.rcParams["axes.prop_cycle"].by_key()["color"], *lighter]
             if matplotlib.colors.to_hex(color) not in taken] or ["black"]
    arches = [split_curve(curve)[0] for curve in curves]
    colors, others = {}, 0
    for curve, arch in zip(curves, arches):
        default = arch in registry.architectures() and split_curve(curve)[1] == next(iter(registry.get(arch).variants))
        if default or (arch in registry.architectures() and arches.count(arch) == 1):
            colors[curve] = architecture_color(arch)
        else:
            colors[curve] = spare[others % len(spare)]
            others += 1
    return colors


def plot_mqar(runs: pd.DataFrame, output_dir: str | Path, name: str = "mqar_recall") -> MQARFigure:
    """Accuracy vs width (log2 axis) per (T, K), best learning rate per point, min-max over
    seeds as error bars; writes ``<name>.png/.pdf``, ``<name>_state.png/.pdf`` (accuracy vs
    state), ``<name>_table.md`` (the points) and ``<name>_runs.md`` (every run's course)."""
    best = best_learning_rate(runs)
    settings = sorted({(row.seq_len, row.num_pairs) for row in best.itertuples()})
    curves = list(dict.fromkeys(best["curve"]))
    colors = curve_colors(curves)
    figure, axes = plt.subplots(1, len(settings), figsize=(4.6 * len(settings), 4), squeeze=False, sharey=True)
    labels = []
    for curve in curves:
        points = best[best["curve"] == curve]
        label = points["label"].iloc[0]
        labels.append(label)
        color = colors[curve]
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
    paths += plot_accuracy_vs_state(best, output_dir, f"{name}_state")
    paths += plot_accuracy_vs_rate(runs, best, output_dir, f"{name}_rates")
    paths.append(Path(output_dir) / f"{name}_table.md")
    paths[-1].write_text(markdown_mqar_table(best))
    paths.append(Path(output_dir) / f"{name}_runs.md")
    paths[-1].write_text(markdown_mqar_runs(runs))
    return MQARFigure(paths=paths, labels=labels, table=best)


def plot_accuracy_vs_rate(runs: pd.DataFrame, best: pd.DataFrame, output_dir: str | Path, name: str) -> list[Path]:
    """Accuracy vs learning rate (log axis), mean over seeds, one line per curve, one panel per
    (T, K) (rows) and width (columns), each curve's best rate ringed: a reader sees whether the
    grid brackets each best (zoology's protocol; "Revisiting associative recall": recurrent models
    recall in a narrow window of rates); a rate that diverged is a cross at 0. Writes ``<name>.png/.pdf``."""
    settings = sorted({(row.seq_len, row.num_pairs) for row in best.itertuples()})
    widths = sorted(best["width"].unique())
    curves = list(dict.fromkeys(best["curve"]))
    colors = curve_colors(curves)
    means = runs.groupby(["curve", "seq_len", "num_pairs", "width", "lr"])["accuracy"].mean().reset_index()
    figure, axes = plt.subplots(len(settings), len(widths), figsize=(3.6 * len(widths), 3.2 * len(settings)),
                                squeeze=False, sharex=True, sharey=True, layout="constrained")
    for row, (t, k) in enumerate(settings):
        for column, width in enumerate(widths):
            ax = axes[row][column]
            for curve in curves:
                points = means[(means["curve"] == curve) & (means["seq_len"] == t) & (means["num_pairs"] == k)
                               & (means["width"] == width)].sort_values("lr")
                if points.empty:
                    continue
                top = best[(best["curve"] == curve) & (best["seq_len"] == t) & (best["num_pairs"] == k)
                           & (best["width"] == width)]
                label = top["label"].iloc[0]
                ax.plot(points["lr"], points["accuracy"], marker="o", color=colors[curve], label=label)
                diverged = points[points["accuracy"].isna()]
                ax.plot(diverged["lr"], [0.0] * len(diverged), marker="x", linestyle="none", color=colors[curve])
                ax.plot(top["lr"], top["accuracy"], marker="o", markersize=11, fillstyle="none", color=colors[curve])
            ax.set(xscale="log", title=f"T = {t}, K = {k}, width {width}", ylim=(-0.02, 1.02))
            ax.grid(True, alpha=0.3)
            if row == len(settings) - 1:
                ax.set_xlabel("learning rate")
            if column == 0:
                ax.set_ylabel("MQAR accuracy")
    handles = {label: handle for ax in axes.flat for handle, label in zip(*ax.get_legend_handles_labels())}
    axes[0][-1].legend(handles.values(), handles.keys(), fontsize=7)
    figure.suptitle("MQAR: accuracy vs learning rate (ringed: each curve's best; x: diverged)")
    return save_figure(figure, output_dir, name)


def state_frontier(points: pd.DataFrame) -> pd.DataFrame:
    """The recall / state-size frontier of ``points`` (columns ``state_bytes``, ``accuracy``):
    the points that no other point beats in accuracy with at most as many bytes (zoology's and
    Based's Pareto frontier), fewest bytes first."""
    ordered = points.sort_values(["state_bytes", "accuracy"], ascending=[True, False])
    best_so_far = ordered["accuracy"].cummax().shift(fill_value=-1.0)
    return ordered[ordered["accuracy"] > best_so_far]


def plot_accuracy_vs_state(best: pd.DataFrame, output_dir: str | Path, name: str) -> list[Path]:
    """Accuracy vs decoding-state bytes per sequence (log axis), one point per curve and width
    (best learning rate), widths joined per curve, and the frontier over every curve (grey steps,
    :func:`state_frontier`); one panel per (T, K). Writes ``<name>.png/.pdf``."""
    settings = sorted({(row.seq_len, row.num_pairs) for row in best.itertuples()})
    curves = list(dict.fromkeys(best["curve"]))
    colors = curve_colors(curves)
    figure, axes = plt.subplots(1, len(settings), figsize=(4.6 * len(settings), 4), squeeze=False, sharey=True)
    for curve in curves:
        points = best[best["curve"] == curve]
        color = colors[curve]
        for ax, (t, k) in zip(axes[0], settings):
            point = points[(points["seq_len"] == t) & (points["num_pairs"] == k)].sort_values("width")
            ax.plot(point["state_bytes"], point["accuracy"], marker="o", color=color, label=points["label"].iloc[0])
            for row in point.itertuples():
                ax.annotate(str(row.width), (row.state_bytes, row.accuracy), fontsize=6, xytext=(2, 2),
                            textcoords="offset points")
    for ax, (t, k) in zip(axes[0], settings):
        frontier = state_frontier(best[(best["seq_len"] == t) & (best["num_pairs"] == k)])
        ax.step(frontier["state_bytes"], frontier["accuracy"], where="post", color="0.5", linestyle="--",
                linewidth=1, zorder=0, label="frontier" if ax is axes[0][-1] else None)
        ax.set(xscale="log", xlabel="decoding state per sequence (bytes, fp32)", title=f"T = {t}, K = {k}",
               ylim=(-0.02, 1.02))
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("MQAR accuracy (best lr)")
    axes[0][-1].legend(fontsize=8)
    figure.suptitle("MQAR: accuracy vs decoding-state size (points labelled with the model width)")
    return save_figure(figure, output_dir, name)
