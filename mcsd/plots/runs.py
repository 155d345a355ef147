"""Figures of training sweeps: Fig. 4 (scaling) and Fig. 9 (ablation), from CSV logs or W&B.

Runs are told apart by what they logged (the model node, the ``choices`` of Hydra's config
groups and the seed, in each run's config), never by directory names: a run's architecture
and variant come from its model node through the registry (``_target_`` and the fields
that the architecture's variants set), so that logs written before a rename still group.
Each curve is the mean over seeds with a min-max band, smoothed (EMA) over the raw mean
drawn faintly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from mcsd.checkpoint.run_folder import csv_logs, data_files  # noqa: E402
from mcsd.checkpoint.wandb_run import find_wandb_runs, read_wandb_run  # noqa: E402
from mcsd.data.tokens import DOCUMENTS  # noqa: E402
from mcsd.errors import MCSDError  # noqa: E402
from mcsd.markdown import markdown_table  # noqa: E402
from mcsd.models import registry  # noqa: E402
from mcsd.plots.style import architecture_color  # noqa: E402
from mcsd.plots.files import save_figure  # noqa: E402

METRICS = ("train/loss", "val/loss", "val/ppl")
LINESTYLES = ["-", "--", "-.", ":"]
SIZE_ORDER = ["tiny", "small", "base", "1.6b", "3b", "10b"]
SMOOTHING = 0.6  # EMA weight of the past (as TensorBoard's default)


@dataclass
class SweepFigure:
    """What ``plot_sweep`` drew: the files, the curve labels (legend order) and the table."""

    paths: list[Path]
    labels: list[str]
    table: pd.DataFrame
    by_seed: pd.DataFrame | None = None
    title: str = ""  # the figure's title: the sweep's name, its runs' experiment, or what it plots


def _run_rows(run: str, config: dict[str, Any], history: pd.DataFrame) -> pd.DataFrame:
    """Long format: one row per (run, metric, logged point), with the run's group choices."""
    choices = config.get("choices") or {}
    history = history.sort_values("step").copy()
    history["trainer/tokens"] = history["trainer/tokens"].ffill()
    frames = []
    for metric in METRICS:
        if metric not in history:
            continue
        points = history.dropna(subset=[metric, "trainer/tokens"])
        frames.append(pd.DataFrame({"run": run, "metric": metric, "tokens": points["trainer/tokens"].astype(float),
                                    "value": points[metric].astype(float)}))
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    rows["arch"], rows["variant"] = run_identity(config)
    rows["size"] = choices.get("size") or ""
    files = data_files(config.get("data"))  # local corpora are named by their files
    rows["experiment"] = choices.get("experiment") or ""
    rows["task"] = choices.get("task") or ""
    rows["data"] = (choices.get("data") or "") + (": " + ", ".join(Path(f).name for f in files) if files else "")
    rows["documents"] = (config.get("data") or {}).get("documents") or "joined"  # (logged before the setting: joined)
    rows["sweep"] = config.get("sweep") or ""  # the sweep folder it ran in (logged since issue 91)
    rows["seed"] = config.get("seed")
    rows["lr"] = (config.get("optimizer") or {}).get("lr")
    rows["params"] = config.get("model/params")
    rows["params_non_embedding"] = config.get("model/params_non_embedding")
    return rows


def run_identity(config: dict[str, Any]) -> tuple[str, str]:
    """``(architecture, variant)`` of a logged run, from its model node through the registry: the
    name is made again from the fields, against today's defaults, so that runs logged before a
    default changed still read as what they were (the ``model/variant`` a run logged is relative to
    its own day's defaults). A model the registry does not know: the ``model/arch`` and
    ``model/variant`` it logged, else the ``choices`` of its config groups."""
    choices = config.get("choices") or {}
    model = config.get("model") or {}
    architecture = registry.of_target(model.get("_target_"))
    if architecture is None:
        return (config.get("model/arch") or choices.get("model") or "",
                config.get("model/variant") or choices.get("variant") or choices.get("ablation") or "")
    return architecture.name, architecture.variant_of(model)


def run_logs(root: str | Path) -> list[tuple[str, dict[str, Any], pd.DataFrame]]:
    """``(run, config, metrics)`` of every run under ``root`` that has
    ``csv/version_0/{metrics.csv,hparams.yaml}`` (``run``: its log's folder relative to ``root``)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} does not exist: give the folder of a sweep (e.g. logs/train/multiruns/<time>)")
    logs = [(str(metrics_file.parent.relative_to(root)), config, pd.read_csv(metrics_file))
            for metrics_file, config in csv_logs(root)]
    if not logs:
        raise MCSDError(f"{root} holds no run logs (csv/version_0/metrics.csv with hparams.yaml): "
                        "point it at a sweep run with the csv logger")
    return logs


def load_csv_runs(root: str | Path) -> pd.DataFrame:
    """Every run under ``root`` that has ``csv/version_0/{metrics.csv,hparams.yaml}``, in long format."""
    return pd.concat([_run_rows(run, config, metrics) for run, config, metrics in run_logs(root)], ignore_index=True)


def _wandb_history(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """A W&B run's history rows as a CSV log's: ``step`` is the trainer's (``trainer/global_step``,
    which Lightning logs in every row; W&B's own ``_step`` counts rows)."""
    history = pd.DataFrame(rows)
    if "trainer/global_step" in history:
        return history.assign(step=history["trainer/global_step"])
    return history.rename(columns={"_step": "step"})


def load_wandb_runs(path: str, group: str) -> pd.DataFrame:
    """The finished runs of a W&B group (``path`` = ENTITY/PROJECT), through the W&B API (online)."""
    import wandb

    frames = [_run_rows(run.id, dict(run.config), _wandb_history(list(run.scan_history())))
              for run in wandb.Api().runs(path, filters={"group": group, "state": "finished"})]
    if not frames:
        raise MCSDError(f"W&B project {path} has no finished runs in group {group!r}: check wandb= and group= "
                        "(a sweep's group is <experiment_name>/<its folder under logs/train/multiruns>)")
    return pd.concat(frames, ignore_index=True)


def load_offline_wandb_runs(folder: str | Path) -> pd.DataFrame:
    """The finished runs whose W&B files lie under ``folder`` (a sweep folder, a run folder, a ``wandb/``
    folder: offline runs, read through W&B's record schema, :mod:`mcsd.checkpoint.wandb_run`); the
    lives of a resumed run (one file each, the same id) are one run."""
    paths = find_wandb_runs(folder)
    if not paths:
        raise MCSDError(f"wandb={folder} holds no W&B runs (wandb/offline-run-*/run-*.wandb): give the folder of a "
                        "sweep or run that logged to W&B (logger=wandb), or wandb=ENTITY/PROJECT group=GROUP")
    lives: dict[str, list] = {}
    for path in paths:
        run = read_wandb_run(path)
        lives.setdefault(run.id, []).append(run)
    frames = []
    for run_id, runs in lives.items():
        if runs[-1].exit_code != 0:
            continue
        history = _wandb_history([row for run in runs for row in run.history])
        history = history.drop_duplicates(subset=[column for column in history if column not in ("_timestamp", "_runtime")])
        frames.append(_run_rows(run_id, runs[-1].config, history))
    if not frames:
        raise MCSDError(f"wandb={folder}: none of its {len(lives)} W&B runs finished (each ended with a nonzero exit "
                        "code): plot a sweep whose runs finished")
    return pd.concat(frames, ignore_index=True)


def check_one_source(kind: str, rows: pd.DataFrame) -> None:
    """Refuse, in one line, a W&B source whose runs of one curve come from more than one sweep, corpus or
    size (they would be averaged as if they were seeds)."""
    for curve, runs in rows.groupby(_curve_key(kind, rows)):
        for column, what in (("sweep", "sweeps"), ("data", "corpora"), ("size", "sizes")):
            values = sorted(str(value) for value in runs[column].unique())
            if len(values) > 1:
                raise MCSDError(f"the runs of curve {curve} come from {len(values)} {what} ({', '.join(values)}), "
                                "which one curve would average as seeds: give one sweep's folder or W&B group")


def _curve_key(kind: str, rows: pd.DataFrame) -> pd.Series:
    """One curve per (architecture, size) for scaling, per (architecture, variant) for ablation;
    runs that differ in ``data.documents`` (a sweep over it) a curve per setting too."""
    key = curve_key(rows["arch"], rows["size" if kind == "scaling" else "variant"])
    if "documents" in rows and rows["documents"].nunique() > 1:
        key = key + DOCUMENTS_MARK + rows["documents"]
    return key


DOCUMENTS_MARK = ", documents "  # in a curve's key and label: its runs' data.documents
CURVE_SEPARATOR = "|"  # in a curve's key, between its architecture and its detail


def curve_key(arch: Any, detail: Any) -> Any:
    """A curve's key (a string, or a column of them from two columns): its architecture and its
    detail (a size for scaling, a variant for ablation), read back by :func:`split_curve`."""
    return arch + CURVE_SEPARATOR + detail


def split_curve(key: str) -> tuple[str, str]:
    """The architecture and the detail of a curve's key (:func:`curve_key`)."""
    arch, detail = key.split(CURVE_SEPARATOR, 1)
    return arch, detail


def arch_label(arch: str) -> str:
    """An architecture's label in figures and tables (the registry's; the name itself if unknown)."""
    return registry.get(arch).label if arch in registry.architectures() else arch


def curve_label(kind: str, key: str, params: float | None) -> str:
    arch, detail = split_curve(key)
    if kind == "scaling":
        return f"{arch_label(arch)} {detail}" + (f" ({params / 1e6:.1f}M)" if params else "")
    detail, _, documents = detail.partition(DOCUMENTS_MARK)
    label = arch_label(arch) if detail in ("default", "") else f"{arch_label(arch)} {detail}"
    return f"{label}{DOCUMENTS_MARK}{documents}" if documents else label


def curve_order(kind: str, key: str) -> tuple:
    """Registry order of architectures, then sizes small to large or the registry's variant order,
    then documents joined before apart."""
    arch, detail = split_curve(key)
    detail, _, documents = detail.partition(DOCUMENTS_MARK)
    documents_rank = DOCUMENTS.index(documents) if documents in DOCUMENTS else -1
    names = registry.architectures()
    arch_rank = names.index(arch) if arch in names else len(names)
    if kind == "scaling":
        return (arch_rank, arch, SIZE_ORDER.index(detail) if detail in SIZE_ORDER else 99, detail, documents_rank)
    variants = list(registry.get(arch).variants) if arch in names else []
    variant = detail.split(", ")[0]  # a variant with settings changed sorts after the variant itself
    return (arch_rank, arch, variants.index(variant) if variant in variants else 99, detail, documents_rank)


def _band(points: pd.DataFrame, smooth: bool) -> pd.DataFrame:
    """Mean, min and max over runs at each token count (each run EMA-smoothed first if asked)."""
    if smooth:
        points = points.sort_values("tokens").copy()
        points["value"] = points.groupby("run")["value"].transform(lambda v: v.ewm(alpha=1 - SMOOTHING).mean())
    return points.groupby("tokens")["value"].agg(["mean", "min", "max"]).reset_index()


def summary_table(kind: str, rows: pd.DataFrame) -> pd.DataFrame:
    """Final validation loss and perplexity per curve: mean, min and max over seeds."""
    rows = rows.assign(curve=_curve_key(kind, rows))
    records = []
    for curve, group in rows.groupby("curve"):
        final = {}
        for metric in ("val/loss", "val/ppl"):
            points = group[group["metric"] == metric]
            last = points.sort_values("tokens").groupby("run").tail(1)
            final[metric] = last["value"]
        tokens = group[group["metric"] == "val/loss"]["tokens"].max()
        records.append({"curve": curve_label(kind, curve, group["params"].max()), "order": curve_order(kind, curve),
                        "seeds": group["run"].nunique(), "tokens": int(tokens) if pd.notna(tokens) else None,
                        "val_loss": final["val/loss"].mean(), "val_loss_min": final["val/loss"].min(),
                        "val_loss_max": final["val/loss"].max(), "val_ppl": final["val/ppl"].mean()})
    table = pd.DataFrame(records).sort_values("order").drop(columns="order").reset_index(drop=True)
    return table


def seed_table(kind: str, rows: pd.DataFrame, reference: str | None = None) -> pd.DataFrame:
    """Final validation perplexity per curve (rows) and seed (columns), with the mean; with a
    ``reference`` curve label, each curve's perplexity divided by the reference's of the same
    seed (paired): the mean ratio and its min and max over the seeds both curves ran."""
    rows = rows.assign(curve=_curve_key(kind, rows))
    final = (rows[rows["metric"] == "val/ppl"].sort_values("tokens").groupby("run").tail(1))
    labels = {key: curve_label(kind, key, group["params"].max()) for key, group in rows.groupby("curve")}
    table = final.pivot_table(index="curve", columns="seed", values="value", aggfunc="mean")
    table = table.loc[sorted(table.index, key=lambda key: curve_order(kind, key))]
    table.index = [labels[key] for key in table.index]
    table.columns = [f"seed {seed}" for seed in table.columns]
    table["mean"] = table.mean(axis=1)
    if reference is not None:
        # A sweep over data.documents: each curve against the reference with its own documents setting.
        references = [reference if reference in table.index else f"{reference}{DOCUMENTS_MARK}{curve.partition(DOCUMENTS_MARK)[2]}"
                      for curve in table.index]
        if any(name not in table.index for name in references):
            raise MCSDError(f"reference={reference!r} is not a curve of this sweep: use one of {', '.join(table.index)}")
        seeds = table.filter(like="seed ")
        ratios = seeds / seeds.loc[references].to_numpy()
        table["ratio"], table["ratio_min"], table["ratio_max"] = ratios.mean(axis=1), ratios.min(axis=1), ratios.max(axis=1)
    table.attrs["reference"] = reference
    return table


def markdown_seed_table(table: pd.DataFrame) -> str:
    """:func:`seed_table` as Markdown: perplexities to one decimal, ratios as percentages."""
    seeds = [column for column in table.columns if column.startswith("seed ")]
    reference = table.attrs.get("reference")
    header = ["curve", *(f"val ppl {column}" for column in seeds), "mean"]
    if reference:
        header.append(f"vs {reference}, paired by seed: mean (min to max)")
    rows = []
    for curve, row in table.iterrows():
        cells = [curve, *(f"{row[column]:.1f}" if pd.notna(row[column]) else "" for column in seeds),
                 f"{row['mean']:.1f}"]
        if reference:
            cells.append(f"{row['ratio'] - 1:+.1%} ({row['ratio_min'] - 1:+.1%} to {row['ratio_max'] - 1:+.1%})")
        rows.append(cells)
    return markdown_table(header, rows) + "\n"


def markdown_sweep_table(table: pd.DataFrame) -> str:
    """A sweep's table (:func:`plot_sweep`) as Markdown: each curve's seeds, tokens and final loss."""
    def spread(row: Any) -> str:
        return f" ({row.val_loss_min:.3f}-{row.val_loss_max:.3f})" if row.seeds > 1 else ""
    return markdown_table(["curve", "seeds", "tokens", "final val loss (min-max)", "final val ppl"],
                          [[row.curve, row.seeds, f"{row.tokens:,}", f"{row.val_loss:.3f}{spread(row)}",
                            f"{row.val_ppl:.1f}"] for row in table.itertuples()]) + "\n"


def plot_sweep(kind: str, rows: pd.DataFrame, output_dir: str | Path, name: str | None = None,
               reference: str | None = None) -> SweepFigure:
    """Training loss (smoothed mean, raw mean faint, min-max band over seeds) and validation
    loss vs training tokens, one curve per size (``scaling``) or per variant (``ablation``).

    Writes ``<name>.png/.pdf``, ``<name>_table.md`` and, when a curve has several seeds or a
    ``reference`` curve is named, ``<name>_by_seed.md`` (:func:`seed_table`)."""
    if kind not in ("scaling", "ablation"):
        raise MCSDError(f"unknown sweep kind {kind!r}: use scaling or ablation")
    for column in ("task", "data"):  # a curve averages its runs as seeds: of one task, on one corpus
        values = sorted(set(rows[column])) if column in rows else []
        if len(values) > 1:
            raise MCSDError(f"mcsd-plot {kind}: the runs differ in their {column} ({', '.join(v or 'none' for v in values)}), "
                            f"and a curve averages its runs as seeds of one {column}: draw a sweep of tasks with "
                            "mcsd-plot tasks source=DIR, or give a folder of runs of one task on one corpus")
    rows = rows.assign(curve=_curve_key(kind, rows))
    keys = sorted(rows["curve"].unique(), key=lambda key: curve_order(kind, key))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    arches = list(dict.fromkeys(split_curve(key)[0] for key in keys))
    details = list(dict.fromkeys(split_curve(key)[1] for key in keys))
    one_curve_each = len(arches) == len(keys)
    figure, (train_ax, val_ax) = plt.subplots(1, 2, figsize=(13, 4.8))
    labels = []
    for index, key in enumerate(keys):
        curve = rows[rows["curve"] == key]
        label = curve_label(kind, key, curve["params"].max())
        labels.append(label)
        arch, detail = split_curve(key)
        style = LINESTYLES[arches.index(arch) % len(LINESTYLES)]  # one line style per architecture
        if kind == "scaling":  # one colour per size
            color = colors[details.index(detail) % len(colors)]
        elif one_curve_each and arch in registry.architectures():  # architectures side by side
            color, style = architecture_color(arch), "-"
        else:  # variants: one colour each
            color = colors[index % len(colors)]
        train = curve[curve["metric"] == "train/loss"]
        if len(train):
            raw, smooth = _band(train, smooth=False), _band(train, smooth=True)
            train_ax.plot(raw["tokens"], raw["mean"], color=color, alpha=0.25, linewidth=0.8)
            train_ax.plot(smooth["tokens"], smooth["mean"], color=color, linestyle=style, label=label)
            train_ax.fill_between(smooth["tokens"], smooth["min"], smooth["max"], color=color, alpha=0.15)
        val = curve[curve["metric"] == "val/loss"]
        if len(val):
            band = _band(val, smooth=False)
            val_ax.plot(band["tokens"], band["mean"], color=color, linestyle=style, marker="o", markersize=3,
                        label=label)
            val_ax.fill_between(band["tokens"], band["min"], band["max"], color=color, alpha=0.15)
    seeds = rows.groupby("curve")["run"].nunique().max()
    for ax, title in ((train_ax, "training loss (EMA; raw mean faint)"), (val_ax, "validation loss")):
        ax.set(xlabel="training tokens", ylabel="loss", title=title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    data = ", ".join(sorted(set(rows["data"]) - {""}))
    # The sweep's own name: given, or its runs' experiment (experiment=fig9_ablation is Fig. 9), else what it plots.
    experiments = sorted(set(rows["experiment"]) - {""}) if "experiment" in rows else []
    title = (name or ", ".join(experiments) or f"{kind} sweep").replace("_", " ")
    figure.suptitle(f"{title} "
                    f"(data: {data}; mean and min-max over {seeds} seed{'s' if seeds > 1 else ''})")
    output_dir = Path(output_dir)
    name = name or ("fig4_scaling" if kind == "scaling" else "fig9_ablation")
    paths = save_figure(figure, output_dir, name)
    table = summary_table(kind, rows)
    table_path = output_dir / f"{name}_table.md"
    table_path.write_text(markdown_sweep_table(table))
    paths.append(table_path)
    by_seed = None
    if seeds > 1 or reference is not None:
        by_seed = seed_table(kind, rows, reference)
        paths.append(output_dir / f"{name}_by_seed.md")
        paths[-1].write_text(markdown_seed_table(by_seed))
    return SweepFigure(paths=paths, labels=labels, table=table, by_seed=by_seed, title=title)
