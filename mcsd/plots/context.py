"""Figure and table of the long-context probe (``mcsd-probe context``): loss by position, and
Delta_N with its swapped-past control, for one probed model or several side by side."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from mcsd.checkpoint import probe_results  # noqa: E402
from mcsd.errors import MCSDError  # noqa: E402
from mcsd.markdown import markdown_table  # noqa: E402
from mcsd.models import registry  # noqa: E402
from mcsd.plots.style import architecture_color  # noqa: E402
from mcsd.plots.files import save_figure  # noqa: E402

def load_context_results(root: str | Path, labels: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every probe result under ``root`` (:func:`mcsd.checkpoint.probe_results.read_all`), or
    those of the models ``labels`` names: the curves and the deltas, each row tagged with its
    ``probe`` folder."""
    curves, deltas = probe_results.read_all(root)
    if labels is not None:
        unknown = sorted(set(labels) - set(deltas["label"]))
        if unknown:
            raise MCSDError(f"curves: no probe of {unknown[0]!r} under {root}: use some of "
                            f"{', '.join(dict.fromkeys(deltas['label']))}")
        curves, deltas = curves[curves["label"].isin(labels)], deltas[deltas["label"].isin(labels)]
    return curves, deltas


def _colors(frame: pd.DataFrame) -> dict[str, str]:
    """One color per label: an architecture's first label takes its colour (:mod:`mcsd.plots.style`)."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors, used = {}, set()
    for index, (label, arch) in enumerate(frame[["label", "arch"]].drop_duplicates().itertuples(index=False)):
        known = arch in registry.architectures() and arch not in used
        colors[label] = architecture_color(arch) if known else cycle[(index + 3) % len(cycle)]
        used.add(arch)
    return colors


def plot_context(curves: pd.DataFrame, deltas: pd.DataFrame, output_dir: str | Path,
                 name: str = "context_probe") -> list[Path]:
    """Left: loss by position (log-spaced bins, 95% bootstrap band); right: Delta_N (solid) and
    the swapped-past control (dashed) vs N with their intervals. One line per probe, one color
    per label (several probes of a label, e.g. seeds, share it)."""
    if "probe" not in curves:
        curves, deltas = curves.assign(probe=""), deltas.assign(probe="")
    colors = _colors(deltas)
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4), layout="constrained")
    labelled = set()
    for probe, curve in curves.groupby("probe", sort=False):
        label = curve["label"].iloc[0]
        middle = np.sqrt(np.maximum(curve["bin_start"], 1) * curve["bin_end"])
        left.plot(middle, curve["loss"], color=colors[label], marker=".", label=None if label in labelled else label)
        left.fill_between(middle, curve["loss_low"], curve["loss_high"], color=colors[label], alpha=0.2)
        delta = deltas[deltas["probe"] == probe].sort_values("window")
        right.errorbar(delta["window"], delta["delta"], capsize=3, marker="o", color=colors[label],
                       yerr=[delta["delta"] - delta["delta_low"], delta["delta_high"] - delta["delta"]])
        right.errorbar(delta["window"], delta["swapped"], capsize=3, marker="x", linestyle="--", color=colors[label],
                       yerr=[delta["swapped"] - delta["swapped_low"], delta["swapped_high"] - delta["swapped"]])
        labelled.add(label)
    length = int(curves["bin_end"].max()) + 1
    left.set(xscale="log", xlabel="position in the document (tokens)", ylabel="loss (nats/token)",
             title=f"loss by position ({length}-token documents)")
    left.legend(fontsize=8)
    right.axhline(0.0, color="black", linewidth=0.8)
    right.set_xscale("log", base=2)
    windows = sorted(int(window) for window in deltas["window"].unique())
    right.set_xticks(windows, [str(window) for window in windows])
    right.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    right.set(xlabel="N: tokens of context kept", ylabel="loss(last N) - loss(whole past)",
              title="Delta_N (solid) and swapped past (dashed)")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
    documents, positions = int(deltas["documents"].max()), int(deltas["positions"].max())
    figure.suptitle(f"long-context probe: {documents} documents, {positions} positions each; 95% bootstrap intervals")
    return save_figure(figure, output_dir, name)


def markdown_context_table(deltas: pd.DataFrame) -> str:
    """Delta_N per N (rows: probes; cells: Delta [low, high] / swapped)."""
    if deltas.empty:
        raise MCSDError("the probe results have no rows")
    if "probe" not in deltas:
        deltas = deltas.assign(probe="")
    windows = sorted(deltas["window"].unique())
    table = []
    for probe, rows in deltas.groupby("probe", sort=False):
        rows = rows.set_index("window")
        cells = [f"{rows.loc[w, 'delta']:+.3f} [{rows.loc[w, 'delta_low']:+.3f}, {rows.loc[w, 'delta_high']:+.3f}] / "
                 f"{rows.loc[w, 'swapped']:+.3f}" if w in rows.index else "" for w in windows]
        table.append([rows["label"].iloc[0], probe, *cells])
    return (markdown_table(["model", "probe", *(f"N={window}" for window in windows)], table)
            + "\n\nDelta_N [95% interval] / swapped-past control, in nats per token.\n")
