"""How runs trained, from ``callbacks.training_dynamics``' logs: each mixer's gradient norm and
output RMS against the step, one line per run (architecture and learning rate), one column per
layer, with the training loss beside them: a layer that learns nothing (its loss on the chance
plateau) is seen against one that learns."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from mcsd.plots.files import save_figure  # noqa: E402
from mcsd.plots.runs import curve_key, curve_label, run_identity, run_logs  # noqa: E402

GRADIENT, OUTPUT = "dynamics/grad_norm/", "dynamics/output_rms/"


def load_dynamics(root: str | Path) -> pd.DataFrame:
    """One row per logged step of every run under ``root`` that logged training dynamics: its
    label (curve, learning rate), the step, the training loss and each ``dynamics/`` column."""
    frames = []
    for run, config, metrics in run_logs(root):
        columns = [column for column in metrics if column.startswith((GRADIENT, OUTPUT))]
        if not columns:
            continue
        arch, variant = run_identity(config)
        lr = float((config.get("optimizer") or {})["lr"])
        logged = metrics.dropna(subset=columns, how="all")[["step", *columns]].groupby("step").first()
        loss = metrics.dropna(subset=["train/loss"]).groupby("step")["train/loss"].first() \
            if "train/loss" in metrics else pd.Series(dtype=float)
        frame = logged.join(loss, how="outer").reset_index()
        frame["run"] = run
        frame["label"] = f"{curve_label('ablation', curve_key(arch, variant), None)}, lr {lr:g}"
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def plot_training_dynamics(dynamics: pd.DataFrame, output_dir: str | Path, name: str) -> list[Path]:
    """Rows: each mixer's gradient norm and its output RMS (log axes), columns the layers; below
    them the training loss. Writes ``<name>.png/.pdf``."""
    layers = sorted({column[len(GRADIENT):] for column in dynamics if column.startswith(GRADIENT)
                     and column.endswith(".mixer")})
    figure, axes = plt.subplots(3, len(layers), figsize=(4.4 * len(layers), 8.4), squeeze=False, sharex=True,
                                layout="constrained")
    for label, run in dynamics.groupby("label", sort=True):
        for column, layer in enumerate(layers):
            for row, prefix in enumerate((GRADIENT, OUTPUT)):
                points = run.dropna(subset=[prefix + layer])
                axes[row][column].plot(points["step"], points[prefix + layer], label=label)
        if "train/loss" in run:
            losses = run.dropna(subset=["train/loss"])
            axes[2][0].plot(losses["step"], losses["train/loss"], label=label)
    for column, layer in enumerate(layers):
        axes[0][column].set(yscale="log", title=f"{layer}: gradient norm")
        axes[1][column].set(yscale="log", title=f"{layer}: output RMS", xlabel="step")
        for row in range(3):
            axes[row][column].grid(True, alpha=0.3)
    axes[2][0].set(title="training loss", xlabel="step")
    for ax in axes[2][1:]:
        ax.set_axis_off()
    axes[0][-1].legend(fontsize=7)
    figure.suptitle("Training dynamics (callbacks.training_dynamics)")
    return save_figure(figure, output_dir, name)
