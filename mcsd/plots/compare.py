"""The architecture comparison's headline table and figure (``mcsd-plot compare source=DIR``): one
row per registered architecture (and each variant with results), gathered from what the
other commands wrote under DIR:

- ``<job>/csv/version_0/``: the training runs (final validation perplexity over seeds);
- ``probe/<job>/context_delta.csv``: ``mcsd-probe context`` (Delta_N at the window where the
  rows differ most, and every row's curve over N);
- ``bench_inference/results.csv``, ``bench_train/results.csv``: ``mcsd-bench`` (decode tokens/s
  at the smallest and largest batch, training tokens/s, decoding-state bytes per sequence);
- an MQAR sweep folder (``mqar=``, default ``DIR/mqar``): accuracy at the hardest setting
  where the anchor (the Transformer) still solves the task.

Rows come from the registry, so an architecture enters the table by registering; a missing
measurement is an empty cell.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from mcsd.checkpoint import bench_results  # noqa: E402
from mcsd.checkpoint.run_folder import csv_logs  # noqa: E402
from mcsd.markdown import markdown_table  # noqa: E402
from mcsd.models import registry  # noqa: E402
from mcsd.plots.style import architecture_color  # noqa: E402
from mcsd.checkpoint.probe_results import DELTA_FILE  # noqa: E402
from mcsd.plots.context import load_context_results  # noqa: E402
from mcsd.plots.files import save_figure  # noqa: E402
from mcsd.plots.mqar import SOLVED, best_learning_rate, curve_colors, load_mqar_runs  # noqa: E402
from mcsd.plots.rates import best_rates  # noqa: E402
from mcsd.plots.runs import curve_key, curve_label, load_csv_runs, split_curve  # noqa: E402

KEY = ["arch", "variant"]


@dataclass
class Comparison:
    """The table (one row per architecture and variant) and what its columns measured."""

    table: pd.DataFrame
    notes: dict[str, str]
    context_curves: pd.DataFrame | None = None  # every row's Delta_N at every probed N
    rate_curves: pd.DataFrame | None = None  # every row's perplexity at every learning rate, where several ran


def final_perplexities(root: Path) -> pd.DataFrame:
    """Every run's final validation perplexity under ``root``, with its architecture, variant,
    learning rate, seed and job (the run's first folder: ``<job>/csv/version_0``). A run whose last
    validation came before the others' (it diverged, or was stopped) has none: the comparison reads
    every run after the same tokens."""
    rows = load_csv_runs(root)
    final = rows[rows["metric"] == "val/ppl"].sort_values("tokens").groupby("run").tail(1).copy()
    final["job"] = final["run"].str.split("/").str[0]
    final.loc[final["tokens"] < final["tokens"].max(), "value"] = np.nan
    return final


def rate_perplexities(final: pd.DataFrame) -> pd.DataFrame:
    """Per row (architecture and variant) and learning rate: the mean final perplexity over seeds,
    its min and max, the parameters, tokens, seeds and jobs. A run that diverged (no finite
    perplexity) counts as no perplexity."""
    final = final.assign(value=final["value"].where(np.isfinite(final["value"])))
    return final.groupby([*KEY, "lr"], dropna=False).agg(
        params=("params", "max"), tokens=("tokens", "max"), seeds=("run", "nunique"), val_ppl=("value", "mean"),
        val_ppl_min=("value", "min"), val_ppl_max=("value", "max"), jobs=("job", list)).reset_index()


def best_rate_perplexities(final: pd.DataFrame) -> pd.DataFrame:
    """Per row: :func:`rate_perplexities` at the learning rate of lowest mean final perplexity,
    rates compared on the seeds they share (:func:`mcsd.plots.rates.best_rates`, the recall grids'
    protocol too), with ``lrs_tried`` and ``at_edge`` (the best is the lowest or highest rate
    tried). A rate that diverged loses to every rate that trained."""
    runs = final.assign(value=final["value"].where(np.isfinite(final["value"])))
    chosen = best_rates(runs, KEY, "value", higher_is_better=False)
    return rate_perplexities(final).merge(chosen, on=[*KEY, "lr"]).reset_index(drop=True)


def best_rate_jobs(root: str | Path) -> list[str]:
    """The jobs (folder names under ``root``) of each row's best learning rate: the runs whose
    models the table's other columns read (``experiments/compare_architectures/run.sh`` probes them)."""
    best = best_rate_perplexities(final_perplexities(Path(root)))
    return sorted({job for jobs in best["jobs"] for job in jobs}, key=lambda job: (len(job), job))


def _mqar(root: Path, notes: dict[str, str], anchor: str) -> pd.DataFrame:
    """Each row's accuracy (best learning rate) at one MQAR point: the hardest (T, K) where the
    ``anchor`` architecture (attention) still reaches :data:`SOLVED`, at the widest width it
    reaches it there, so that the column separates models that recall from models that do not.
    Without such a point (an anchor not run, or not converged), each row's hardest point run."""
    anchor_label = registry.get(anchor).label  # an unknown name: a one-line error
    best = best_learning_rate(load_mqar_runs(root))
    best["arch"], best["variant"] = zip(*(split_curve(curve) for curve in best["curve"]))
    solved = best[(best["arch"] == anchor) & (best["accuracy"] >= SOLVED)]
    if len(solved):
        point = solved.sort_values(["seq_len", "num_pairs", "width"]).iloc[-1]
        chosen = best[(best["seq_len"] == point["seq_len"]) & (best["num_pairs"] == point["num_pairs"])
                      & (best["width"] == point["width"])]
        notes["mqar"] = (f"T={int(point['seq_len'])}, K={int(point['num_pairs'])}, width {int(point['width'])}: the hardest "
                         f"setting where {anchor_label} reaches {SOLVED} ({point['accuracy']:.3f})")
    else:
        chosen = best.sort_values(["seq_len", "num_pairs", "width"]).groupby(KEY).tail(1)
        settings = {(int(row.seq_len), int(row.num_pairs), int(row.width)) for row in chosen.itertuples()}
        notes["mqar"] = ("; ".join(f"T={t}, K={k}, width {w}" for t, k, w in sorted(settings))
                         + f" (each row's hardest setting run: {anchor_label} reaches {SOLVED} at none)")
    chosen = chosen.copy()
    # A variant run with a setting of its own (the hybrid's attention_every=2, so that 2 layers hold an
    # attention layer) stands for its registered variant when that was not run itself; the note says so.
    variants = set(zip(chosen["arch"], chosen["variant"]))
    for index, row in chosen.iterrows():
        base, _, setting = row["variant"].partition(", ")
        if setting and (row["arch"], base) not in variants:
            chosen.loc[index, "variant"] = base
            notes["mqar"] += f"; {registry.get(row['arch']).label} with {setting}"
    return chosen.rename(columns={"accuracy": "mqar_acc"})[[*KEY, "mqar_acc"]]


def _context(root: Path, notes: dict[str, str], jobs: set[str] | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Delta_N at the window N where the rows' mean Delta_N (over seeds) spread the most (max -
    min; the longest such N on a tie, e.g. one row), and every row's full Delta_N curve (mean
    over seeds, for the figure); of the probes of ``jobs`` alone (each row's best learning rate)
    where the training runs are known."""
    _, deltas = load_context_results(root)
    if jobs is not None:
        deltas = deltas[deltas["probe"].isin(jobs)]
    curves = deltas.groupby([*KEY, "window"]).agg(delta=("delta", "mean"), delta_low=("delta_low", "min"),
                                                  delta_high=("delta_high", "max"),
                                                  swapped=("swapped", "mean")).reset_index()
    spread = curves.groupby("window")["delta"].agg(lambda values: values.max() - values.min())
    window = int(spread[spread == spread.max()].index.max())
    notes["context_window"] = str(window)
    notes["context"] = (f"N={window}, the window where the rows' Delta_N differ most (spread {spread.max():.3f} nats; "
                        f"every N in the figure), {int(deltas['documents'].max())} documents")
    return curves[curves["window"] == window].drop(columns="window"), curves


def _decode(path: Path, notes: dict[str, str]) -> pd.DataFrame:
    """Decode tokens/s (``batch / decode seconds per step``, each a median over the bench's
    repeats) at the longest generated length, at the smallest batch and, when run, the largest;
    and one sequence's decoding-state bytes there."""
    _, frame = bench_results.read(path)
    frame = frame[(frame["status"] == "ok") & (frame["gen_len"] == frame["gen_len"].max())]
    frame = frame.assign(decode_tokens_per_s=frame["batch"] / frame["decode_s_per_token"])
    smallest, largest = int(frame["batch"].min()), int(frame["batch"].max())
    notes["decode"] = (f"{int(frame['prompt_len'].iloc[0])}-token prompt + {int(frame['gen_len'].iloc[0])} generated, "
                       f"batch {smallest}" + (f" and {largest}" if largest > smallest else "")
                       + f" (batch x steps / decode seconds), {frame['device'].iloc[0]}")
    columns = ["decode_tokens_per_s"] + (["state_bytes_per_sequence"] if "state_bytes_per_sequence" in frame else [])
    result = frame[frame["batch"] == smallest].groupby(KEY)[columns].median().reset_index()
    if largest > smallest:
        batched = frame[frame["batch"] == largest].groupby(KEY)["decode_tokens_per_s"].median()
        result = result.merge(batched.rename("decode_batched_tokens_per_s").reset_index(), on=KEY, how="outer")
        notes["decode_batch"] = str(largest)
    return result


def _train_speed(path: Path, notes: dict[str, str]) -> pd.DataFrame:
    _, frame = bench_results.read(path)
    forms = {name: registry.get(name).train_form for name in registry.architectures()}
    frame = frame[(frame["status"] == "ok") & (frame["form"] == frame["arch"].map(forms))]
    frame = frame[frame["seq_len"] == frame["seq_len"].max()]
    notes["train"] = (f"training form, batch {int(frame['batch'].iloc[0])} x {int(frame['seq_len'].iloc[0])} "
                      f"tokens, {frame['device'].iloc[0]}")
    return frame.groupby(KEY)["tokens_per_s"].median().rename("train_tokens_per_s").reset_index()


def comparison_table(root: str | Path, mqar: str | Path | None = None, mqar_anchor: str = "transformer") -> Comparison:
    """Gather every measurement under ``root`` (and ``mqar``) into one row per architecture
    variant: each registered architecture with a result, its default variant, then each other
    variant that has a result, in registry order (one registered since the runs has no row). MQAR accuracy is read where ``mqar_anchor`` still solves it."""
    root = Path(root)
    notes: dict[str, str] = {}
    parts, curves, best_jobs, rate_curves = [], None, None, None
    if csv_logs(root):
        final = final_perplexities(root)
        by_rate, training = rate_perplexities(final), best_rate_perplexities(final)
        best_jobs = {job for jobs in training["jobs"] for job in jobs}
        parts.append(training.drop(columns="jobs"))
        if (training["lrs_tried"] > 1).any():
            rate_curves = by_rate.drop(columns="jobs")
            notes["rates"] = ("each row at its learning rate of lowest mean validation perplexity, of the rates it was "
                              "trained at, compared on the seeds every rate ran (every rate's perplexity: the rates figure)")
    mqar = Path(mqar) if mqar else root / "mqar"
    if mqar.is_dir():
        parts.append(_mqar(mqar, notes, mqar_anchor))
    if (root / "probe").is_dir() and any((root / "probe").rglob(DELTA_FILE)):
        at_window, curves = _context(root / "probe", notes, best_jobs)
        parts.append(at_window)
    if (root / "bench_inference" / bench_results.RESULTS_CSV).is_file():
        parts.append(_decode(root / "bench_inference" / bench_results.RESULTS_CSV, notes))
    if (root / "bench_train" / bench_results.RESULTS_CSV).is_file():
        parts.append(_train_speed(root / "bench_train" / bench_results.RESULTS_CSV, notes))
    measured = pd.DataFrame(columns=KEY)
    for part in parts:
        measured = measured.merge(part, on=KEY, how="outer")
    rows = []
    for name in registry.architectures():
        variants = list(registry.get(name).variants)
        present = set(measured.loc[measured["arch"] == name, "variant"])
        if not present:  # not in this comparison's runs (registered since, or left out of the sweep)
            continue
        for variant in [variants[0], *(v for v in variants[1:] if v in present), *sorted(present - set(variants))]:
            match = measured[(measured["arch"] == name) & (measured["variant"] == variant)]
            row = match.iloc[0].to_dict() if len(match) else {"arch": name, "variant": variant}
            rows.append({"label": curve_label("ablation", curve_key(name, variant), None), **row})
    return Comparison(table=pd.DataFrame(rows), notes=notes, context_curves=curves, rate_curves=rate_curves)


# (header, the column that must be measured, the cell's format over the row)
COLUMNS = [("model", "label", "{label}"), ("params", "params", "{params:,.0f}"),
           ("val ppl, mean (min-max)", "val_ppl", "{val_ppl:.2f} ({val_ppl_min:.2f}-{val_ppl_max:.2f})"),
           ("seeds", "seeds", "{seeds:.0f}"), ("lr (rates tried)", "lr", "{lr:g}{edge} ({lrs_tried:.0f})"),
           ("MQAR acc", "mqar_acc", "{mqar_acc:.3f}"),
           ("Delta_N at N={context_window} [interval] / swapped", "delta", "{delta:+.3f} [{delta_low:+.3f}, {delta_high:+.3f}] / {swapped:+.3f}"),
           ("train tokens/s", "train_tokens_per_s", "{train_tokens_per_s:,.0f}"),
           ("decode tokens/s", "decode_tokens_per_s", "{decode_tokens_per_s:,.0f}"),
           ("decode tokens/s, batch {decode_batch}", "decode_batched_tokens_per_s", "{decode_batched_tokens_per_s:,.0f}"),
           ("state KiB / sequence", "state_bytes_per_sequence", "{state_kib:,.1f}")]


def _cell(row: dict, column: str, text: str) -> str:
    """``text`` formatted over ``row``; empty where ``column`` was not measured."""
    if pd.isna(row.get(column)):
        return ""
    at_edge = row.get("at_edge")
    return text.format(**row, state_kib=row.get("state_bytes_per_sequence", 0) / 1024,
                       edge="*" if pd.notna(at_edge) and bool(at_edge) else "")


def _complete(text: str, notes: dict[str, str]) -> str:
    """``text`` with its ``{note}`` fields filled from ``notes`` (``?`` where a note is missing)."""
    return text.format_map(defaultdict(lambda: "?", notes))


def _columns(comparison: Comparison) -> list[tuple[str, str, str]]:
    """The table's columns: every one of :data:`COLUMNS` but a batched-decode column not run and
    the learning rate where each row ran at one, headers completed from the notes."""
    skipped = {column for column, shown in [("decode_batched_tokens_per_s", "decode_batched_tokens_per_s" in comparison.table),
                                            ("lr", "rates" in comparison.notes)] if not shown}
    return [(_complete(header, comparison.notes), column, text) for header, column, text in COLUMNS if column not in skipped]


def markdown_comparison(comparison: Comparison) -> str:
    """The table as Markdown (an empty cell: not measured), with a line per column source below it."""
    columns = _columns(comparison)
    lines = [markdown_table([header for header, _, _ in columns],
                            [[_cell(row, column, text) for _, column, text in columns]
                             for row in comparison.table.to_dict("records")])]
    tokens = comparison.table["tokens"].dropna() if "tokens" in comparison.table else pd.Series(dtype=float)
    sources = {"training": f"final validation perplexity after {int(tokens.max()):,} tokens" if len(tokens) else None,
               "mqar": comparison.notes.get("mqar"), "context": comparison.notes.get("context"),
               "decode": comparison.notes.get("decode"), "train": comparison.notes.get("train")}
    if "rates" in comparison.notes:
        sources["training"] += f"; {comparison.notes['rates']}"
    lines.append("")
    lines += [f"- {key}: {value}" for key, value in sources.items() if value]
    if "rates" in comparison.notes and comparison.table["at_edge"].eq(True).any():
        lines += ["", "\\* the best of the rates tried is the lowest or the highest of them: the grid does not bracket it."]
    return "\n".join(lines) + "\n"


# (column, title (completed from the notes), error-bar low and high columns, x scale)
PANELS = [("val_ppl", "validation perplexity", "val_ppl_min", "val_ppl_max", "linear"),
          ("mqar_acc", "MQAR accuracy", None, None, "linear"),
          ("delta", "Delta_N at N={context_window} (nats)", "delta_low", "delta_high", "linear"),
          ("decode_tokens_per_s", "decode tokens/s, batch 1", None, None, "linear"),
          ("decode_batched_tokens_per_s", "decode tokens/s, batch {decode_batch}", None, None, "linear"),
          ("state_bytes_per_sequence", "decoding state bytes / sequence", None, None, "log")]


def plot_comparison(comparison: Comparison, output_dir: str | Path, name: str = "architectures_compared") -> list[Path]:
    """One horizontal bar panel per measurement (min-max over seeds or the bootstrap interval as
    error bars) and, below them, every row's Delta_N curve over N; writes ``<name>.png/.pdf``,
    ``<name>_table.md`` and, where some row ran at several learning rates, ``<name>_rates.png/.pdf``
    (removed where none did, so that a redrawn folder holds no stale rates figure)."""
    table = comparison.table.iloc[::-1].reset_index(drop=True)  # the first row on top
    panels = [panel for panel in PANELS if panel[0] in table and table[panel[0]].notna().any()]
    curves = comparison.context_curves
    width = max(len(panels), 1)
    figure = plt.figure(figsize=(3.2 * width, 0.45 * len(table) + 1.6 + (4.0 if curves is not None else 0)),
                        layout="constrained")
    grid = figure.add_gridspec(2 if curves is not None else 1, width,
                               height_ratios=[0.45 * len(table) + 1.6, 4.0] if curves is not None else None)
    axes = [figure.add_subplot(grid[0, 0])]
    axes += [figure.add_subplot(grid[0, index], sharey=axes[0]) for index in range(1, width)]
    colors = [architecture_color(arch) for arch in table["arch"]]
    for ax, (column, title, low, high, scale) in zip(axes, panels):
        values = table[column].astype(float)
        error = None
        if low and high:
            error = np.vstack([(values - table[low].astype(float)).fillna(0), (table[high].astype(float) - values).fillna(0)])
        ax.barh(range(len(table)), values.fillna(0), xerr=error, color=colors, alpha=0.8, capsize=3)
        ax.set(title=_complete(title, comparison.notes), xscale=scale)
        if scale == "linear":
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(4))
        ax.grid(True, axis="x", alpha=0.3)
        if column == "delta":
            ax.axvline(0.0, color="black", linewidth=0.8)
        if ax is not axes[0]:
            ax.tick_params(labelleft=False)
    axes[0].set_yticks(range(len(table)), table["label"])
    if curves is not None:
        _plot_context_curves(figure.add_subplot(grid[1, :]), comparison)
    paths = save_figure(figure, output_dir, name)
    if comparison.rate_curves is not None:
        paths += _plot_rates(comparison, output_dir, f"{name}_rates")
    else:  # a rates figure drawn before (when some row had several rates) no longer matches the rows
        for suffix in ("png", "pdf"):
            (Path(output_dir) / f"{name}_rates.{suffix}").unlink(missing_ok=True)
    paths.append(Path(output_dir) / f"{name}_table.md")
    paths[-1].write_text(markdown_comparison(comparison))
    return paths


def _plot_context_curves(ax: plt.Axes, comparison: Comparison) -> None:
    """Every row's mean Delta_N (over seeds) against N, the table's window marked."""
    curves = comparison.context_curves
    keys = [curve_key(arch, variant) for arch, variant in comparison.table[KEY].itertuples(index=False)]
    colors = curve_colors(keys)
    for key, label in zip(keys, comparison.table["label"]):
        arch, variant = split_curve(key)
        curve = curves[(curves["arch"] == arch) & (curves["variant"] == variant)].sort_values("window")
        if len(curve):
            ax.plot(curve["window"], curve["delta"], marker="o", color=colors[key], label=label)
    windows = sorted(int(window) for window in curves["window"].unique())
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.axvline(int(comparison.notes["context_window"]), color="gray", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(windows, [str(window) for window in windows])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set(xlabel="N: tokens of context kept", ylabel="Delta_N (nats), mean over seeds",
           title="Delta_N at every N (dotted: the table's N)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)


def _plot_rates(comparison: Comparison, output_dir: str | Path, name: str) -> list[Path]:
    """Validation perplexity against the learning rate (log axes), mean over seeds with the min-max
    band, one line per row run at several rates, each row's best rate ringed: whether the grid
    brackets each best. Writes ``<name>.png/.pdf``."""
    keys = [curve_key(arch, variant) for arch, variant in comparison.table[KEY].itertuples(index=False)]
    colors = curve_colors(keys)
    figure, ax = plt.subplots(figsize=(7.5, 5.0), layout="constrained")
    for key, row in zip(keys, comparison.table.to_dict("records")):
        arch, variant = split_curve(key)
        points = comparison.rate_curves[(comparison.rate_curves["arch"] == arch)
                                        & (comparison.rate_curves["variant"] == variant)].dropna(subset=["val_ppl"])
        points = points.sort_values("lr")
        if len(points) < 2:
            continue
        ax.plot(points["lr"], points["val_ppl"], marker="o", color=colors[key], label=row["label"])
        ax.fill_between(points["lr"], points["val_ppl_min"], points["val_ppl_max"], color=colors[key], alpha=0.15)
        ax.plot([row["lr"]], [row["val_ppl"]], marker="o", markersize=11, fillstyle="none", color=colors[key])
    ax.set(xscale="log", yscale="log", xlabel="learning rate", ylabel="final validation perplexity",
           title="Perplexity against learning rate (ringed: each row's best; a run that diverged is left out)")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(figure, output_dir, name)
