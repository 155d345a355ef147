"""The architecture comparison's headline table and figure (``mcsd-plot compare DIR``): one
row per registered architecture (and each variant with results), gathered from what the
other commands wrote under DIR:

- ``<job>/csv/version_0/``: the training runs (final validation perplexity over seeds);
- ``probe/<job>/context_delta.csv``: ``mcsd-probe context`` (Delta_N at the longest N);
- ``bench_inference/results.csv``, ``bench_train/results.csv``: ``mcsd-bench`` (decode and
  training tokens/s, decoding-state bytes per sequence);
- an MQAR sweep folder (``--mqar``, default ``DIR/mqar``): accuracy at its hardest setting.

Rows come from the registry, so an architecture enters the table by registering; a missing
measurement is an empty cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from mcsd.models import registry  # noqa: E402
from mcsd.plots.context import DELTA_FILE, load_context_results  # noqa: E402
from mcsd.plots.files import save_figure  # noqa: E402
from mcsd.plots.mqar import best_learning_rate, load_mqar_runs  # noqa: E402
from mcsd.plots.runs import curve_label, load_csv_runs  # noqa: E402

KEY = ["arch", "variant"]


@dataclass
class Comparison:
    """The table (one row per architecture and variant) and what its columns measured."""

    table: pd.DataFrame
    notes: dict[str, str]


def _training(root: Path) -> pd.DataFrame:
    rows = load_csv_runs(root)
    final = rows[rows["metric"] == "val/ppl"].sort_values("tokens").groupby("run").tail(1)
    return final.groupby(KEY).agg(params=("params", "max"), tokens=("tokens", "max"), seeds=("run", "nunique"),
                                  val_ppl=("value", "mean"), val_ppl_min=("value", "min"),
                                  val_ppl_max=("value", "max")).reset_index()


def _mqar(root: Path, notes: dict[str, str]) -> pd.DataFrame:
    best = best_learning_rate(load_mqar_runs(root))
    best["arch"], best["variant"] = zip(*(curve.split("|", 1) for curve in best["curve"]))
    hardest = best.sort_values(["seq_len", "num_pairs", "width"]).groupby(KEY).tail(1)
    settings = {(int(row.seq_len), int(row.num_pairs), int(row.width)) for row in hardest.itertuples()}
    notes["mqar"] = "; ".join(f"T={t}, K={k}, width {w}" for t, k, w in sorted(settings))
    # A variant run with a setting of its own (the hybrid's attention_every=2, so that 2 layers hold an
    # attention layer) stands for its registered variant when that was not run itself; the note says so.
    variants = set(zip(hardest["arch"], hardest["variant"]))
    for index, row in hardest.iterrows():
        base, _, setting = row["variant"].partition(", ")
        if setting and (row["arch"], base) not in variants:
            hardest.loc[index, "variant"] = base
            notes["mqar"] += f"; {registry.get(row['arch']).label} with {setting}"
    return hardest.rename(columns={"accuracy": "mqar_acc"})[[*KEY, "mqar_acc"]]


def _context(root: Path, notes: dict[str, str]) -> pd.DataFrame:
    _, deltas = load_context_results(root)
    longest = deltas[deltas["window"] == deltas["window"].max()]
    notes["context"] = f"N={int(longest['window'].iloc[0])}, {int(longest['documents'].max())} documents"
    return longest.groupby(KEY).agg(delta=("delta", "mean"), delta_low=("delta_low", "min"),
                                    delta_high=("delta_high", "max"), swapped=("swapped", "mean")).reset_index()


def _decode(path: Path, notes: dict[str, str]) -> pd.DataFrame:
    frame = pd.read_csv(path)
    frame = frame[(frame["status"] == "ok") & (frame["gen_len"] == frame["gen_len"].max())]
    frame = frame[frame["batch"] == frame["batch"].min()]
    notes["decode"] = (f"{int(frame['prompt_len'].iloc[0])}-token prompt + {int(frame['gen_len'].iloc[0])} generated, "
                       f"batch {int(frame['batch'].iloc[0])}, {frame['device'].iloc[0]}")
    frame = frame.assign(decode_tokens_per_s=1 / frame["decode_s_per_token"])
    columns = ["decode_tokens_per_s"] + (["state_bytes_per_sequence"] if "state_bytes_per_sequence" in frame else [])
    return frame.groupby(KEY)[columns].median().reset_index()


def _train_speed(path: Path, notes: dict[str, str]) -> pd.DataFrame:
    frame = pd.read_csv(path)
    forms = {name: registry.get(name).train_form for name in registry.architectures()}
    frame = frame[(frame["status"] == "ok") & (frame["form"] == frame["arch"].map(forms))]
    frame = frame[frame["seq_len"] == frame["seq_len"].max()]
    notes["train"] = (f"training form, batch {int(frame['batch'].iloc[0])} x {int(frame['seq_len'].iloc[0])} "
                      f"tokens, {frame['device'].iloc[0]}")
    return frame.groupby(KEY)["tokens_per_s"].median().rename("train_tokens_per_s").reset_index()


def comparison_table(root: str | Path, mqar: str | Path | None = None) -> Comparison:
    """Gather every measurement under ``root`` (and ``mqar``) into one row per architecture
    variant: every registered architecture's default variant, then each other variant that
    has a result, in registry order."""
    root = Path(root)
    notes: dict[str, str] = {}
    parts = []
    if any(root.rglob("metrics.csv")):
        parts.append(_training(root))
    mqar = Path(mqar) if mqar else root / "mqar"
    if mqar.is_dir():
        parts.append(_mqar(mqar, notes))
    if (root / "probe").is_dir() and any((root / "probe").rglob(DELTA_FILE)):
        parts.append(_context(root / "probe", notes))
    if (root / "bench_inference" / "results.csv").is_file():
        parts.append(_decode(root / "bench_inference" / "results.csv", notes))
    if (root / "bench_train" / "results.csv").is_file():
        parts.append(_train_speed(root / "bench_train" / "results.csv", notes))
    measured = pd.DataFrame(columns=KEY)
    for part in parts:
        measured = measured.merge(part, on=KEY, how="outer")
    rows = []
    for name in registry.architectures():
        variants = list(registry.get(name).variants)
        present = set(measured.loc[measured["arch"] == name, "variant"])
        for variant in [variants[0], *(v for v in variants[1:] if v in present), *sorted(present - set(variants))]:
            match = measured[(measured["arch"] == name) & (measured["variant"] == variant)]
            row = match.iloc[0].to_dict() if len(match) else {"arch": name, "variant": variant}
            rows.append({"label": curve_label("ablation", f"{name}|{variant}", None), **row})
    return Comparison(table=pd.DataFrame(rows), notes=notes)


# (header, the column that must be measured, the cell's format over the row)
COLUMNS = [("model", "label", "{label}"), ("params", "params", "{params:,.0f}"),
           ("val ppl, mean (min-max)", "val_ppl", "{val_ppl:.2f} ({val_ppl_min:.2f}-{val_ppl_max:.2f})"),
           ("seeds", "seeds", "{seeds:.0f}"), ("MQAR acc", "mqar_acc", "{mqar_acc:.3f}"),
           ("Delta_N [interval] / swapped", "delta", "{delta:+.3f} [{delta_low:+.3f}, {delta_high:+.3f}] / {swapped:+.3f}"),
           ("train tokens/s", "train_tokens_per_s", "{train_tokens_per_s:,.0f}"),
           ("decode tokens/s", "decode_tokens_per_s", "{decode_tokens_per_s:,.0f}"),
           ("state KiB / sequence", "state_bytes_per_sequence", "{state_kib:,.1f}")]


def _cell(row: dict, column: str, text: str) -> str:
    """``text`` formatted over ``row``; empty where ``column`` was not measured."""
    if pd.isna(row.get(column)):
        return ""
    return text.format(**row, state_kib=row.get("state_bytes_per_sequence", 0) / 1024)


def markdown_comparison(comparison: Comparison) -> str:
    """The table as Markdown (an empty cell: not measured), with a line per column source below it."""
    lines = ["| " + " | ".join(header for header, _, _ in COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for row in comparison.table.to_dict("records"):
        lines.append("| " + " | ".join(_cell(row, column, text) for _, column, text in COLUMNS) + " |")
    tokens = comparison.table["tokens"].dropna() if "tokens" in comparison.table else pd.Series(dtype=float)
    sources = {"training": f"final validation perplexity after {int(tokens.max()):,} tokens" if len(tokens) else None,
               "mqar": comparison.notes.get("mqar"), "context": comparison.notes.get("context"),
               "decode": comparison.notes.get("decode"), "train": comparison.notes.get("train")}
    lines.append("")
    lines += [f"- {key}: {value}" for key, value in sources.items() if value]
    return "\n".join(lines) + "\n"


PANELS = [("val_ppl", "validation perplexity", "val_ppl_min", "val_ppl_max", "linear"),
          ("mqar_acc", "MQAR accuracy", None, None, "linear"),
          ("delta", "Delta_N at the longest N (nats)", "delta_low", "delta_high", "linear"),
          ("decode_tokens_per_s", "decode tokens/s", None, None, "linear"),
          ("state_bytes_per_sequence", "decoding state bytes / sequence", None, None, "log")]


def plot_comparison(comparison: Comparison, output_dir: str | Path, name: str = "architectures_compared") -> list[Path]:
    """One horizontal bar panel per measurement (min-max over seeds or the bootstrap interval as
    error bars); writes ``<name>.png/.pdf`` and ``<name>_table.md``."""
    table = comparison.table.iloc[::-1].reset_index(drop=True)  # the first row on top
    panels = [panel for panel in PANELS if panel[0] in table and table[panel[0]].notna().any()]
    figure, axes = plt.subplots(1, max(len(panels), 1), figsize=(3.2 * max(len(panels), 1), 0.45 * len(table) + 1.6),
                                sharey=True, squeeze=False)
    colors = [registry.get(arch).color if arch in registry.architectures() else "tab:gray" for arch in table["arch"]]
    for ax, (column, title, low, high, scale) in zip(axes[0], panels):
        values = table[column].astype(float)
        error = None
        if low and high:
            error = np.vstack([(values - table[low].astype(float)).fillna(0), (table[high].astype(float) - values).fillna(0)])
        ax.barh(range(len(table)), values.fillna(0), xerr=error, color=colors, alpha=0.8, capsize=3)
        ax.set(title=title, xscale=scale)
        if scale == "linear":
            ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(4))
        ax.grid(True, axis="x", alpha=0.3)
        if column == "delta":
            ax.axvline(0.0, color="black", linewidth=0.8)
    axes[0][0].set_yticks(range(len(table)), table["label"])
    paths = save_figure(figure, output_dir, name)
    paths.append(Path(output_dir) / f"{name}_table.md")
    paths[-1].write_text(markdown_comparison(comparison))
    return paths
