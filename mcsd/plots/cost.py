"""Figures of the cost benchmarks (``mcsd-bench``): the paper's Figs. 5-8 and training cost."""

from __future__ import annotations

import collections
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from mcsd.checkpoint import bench_results  # noqa: E402
from mcsd.errors import MCSDError  # noqa: E402
from mcsd.models import registry  # noqa: E402
from mcsd.plots.style import architecture_color  # noqa: E402
from mcsd.plots.files import save_figure  # noqa: E402

LINESTYLES = ["-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1))]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
OTHER = {"inference": "train", "train": "inference"}
POSITIVE = {"inference": ("batch", "gen_len", "latency_s", "tokens_per_s"),  # grid columns positive in a measured point
            "train": ("batch", "seq_len", "tokens_per_s")}


def read_results(path: str | Path, kind: str | None = None) -> tuple[dict, pd.DataFrame]:
    """A results file of ``mcsd-bench`` (:func:`mcsd.checkpoint.bench_results.read`): header and
    points, each model's series marked. With ``kind`` (inference or train), a file that is not one,
    holds no measured point or holds an impossible one is refused, saying why."""
    path = bench_results.results_file(path)
    head, frame = bench_results.read(path)
    if kind is not None:
        _check_results(path, frame, kind)
    # A model measured with several kernel backends (or documents settings, weight formats, runtimes):
    # a series for each, every axis judged on the model's own rows before any mark is appended.
    several = {column: frame.groupby("model")[column].transform("nunique") > 1
               for column in SERIES_MARKS if column in frame and len(frame)}
    for column, rows in several.items():
        frame.loc[rows, "model"] = frame.loc[rows, "model"] + SERIES_MARKS[column] + frame.loc[rows, column].astype(str)
    return head, frame


def _check_results(path: Path, frame: pd.DataFrame, kind: str) -> None:
    missing = [column for column in bench_results.REQUIRED[kind] if column not in frame]
    if missing:
        other = OTHER[kind]
        if not [column for column in bench_results.REQUIRED[other] if column not in frame]:
            raise MCSDError(f"{path} holds {'training' if other == 'train' else 'inference'} results: use mcsd-plot "
                            f"{other} {path}")
        raise MCSDError(f"{path} is not an mcsd-bench {kind} results file: it lacks the column"
                        f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        statuses = ", ".join(f"{count} {status}" for status, count in frame["status"].value_counts().items())
        raise MCSDError(f"{path} has no measured point (status ok; it has {statuses or 'no rows'}): nothing to draw; "
                        "measure again (mcsd-bench)")
    for column in POSITIVE[kind]:
        values = pd.to_numeric(ok[column], errors="coerce")
        bad = ok[~(values > 0)]
        if len(bad):
            raise MCSDError(f"{path} holds impossible points ({column}={bad[column].iloc[0]} in {len(bad)} of them): "
                            "measure again with a valid grid")


def _arch(frame: pd.DataFrame, model: str) -> str:
    """The architecture of a ``model`` entry (results written before the ``arch`` column
    named architectures only)."""
    if "arch" in frame:
        return frame.loc[frame["model"] == model, "arch"].iloc[0]
    return model


def _color(arch: str) -> str:
    return architecture_color(arch)


# In a model entry (read_results): the series of one kernel backend, of one documents setting, of
# one weight format, of one runtime (each appended in this order).
SERIES_MARKS = {"kernels": " kernels=", "documents": " documents=", "weights": " weights=", "runtime": " runtime="}


RUNTIME_LABELS = {"torch": "PyTorch", "onnx": "ONNX Runtime"}


def model_label(arch: str, model: str) -> str:
    """The registry's label of ``arch``; a saved model adds its file or folder name; a series of
    one kernel backend, documents setting or weight format, its name (``MCSD, fla kernels, documents
    apart``, ``MCSD, int8 weights``)."""
    model, _, runtime = model.partition(SERIES_MARKS["runtime"])
    model, _, weights = model.partition(SERIES_MARKS["weights"])
    model, _, documents = model.partition(SERIES_MARKS["documents"])
    model, _, kernels = model.partition(SERIES_MARKS["kernels"])
    label = registry.get(arch).label if arch in registry.architectures() else arch
    label = label if model == arch else f"{label} ({Path(model).name})"
    return (label + (f", {kernels} kernels" if kernels else "") + (f", documents {documents}" if documents else "")
            + (f", {weights} weights" if weights else "") + (f", {RUNTIME_LABELS.get(runtime, runtime)}" if runtime else ""))


def flagged(frame: pd.DataFrame) -> pd.Series:
    """The points the benchmark marked as taken on a shared machine (``shared``) or with repeats
    that spread (``unsteady``): drawn hollow."""
    marks = pd.Series(False, index=frame.index)
    for column in ("shared", "unsteady"):
        if column in frame:
            marks |= frame[column].map(lambda value: str(value).strip().lower() in ("true", "1", "1.0"))
    return marks


HOLLOW_NOTE = "hollow: shared machine or unsteady repeats"


def _hollow(ax: plt.Axes, points: pd.DataFrame, x: str, y: str, scale: float, color: str, marker: str) -> None:
    """Draw the flagged ones of ``points`` over their filled markers, hollow."""
    marked = points[flagged(points)]
    if len(marked):
        ax.plot(marked[x], marked[y] * scale, linestyle="none", marker=marker, markerfacecolor="white",
                markeredgecolor=color, markeredgewidth=1.5, zorder=3)


OOM_NOTE = "out of memory (x on the top edge, in its curve's colour)"


def _legend_entries(ax: plt.Axes, frame: pd.DataFrame) -> tuple[list, list[str]]:
    """``ax``'s legend entries, with one saying what hollow markers mean where there are some."""
    handles, labels = ax.get_legend_handles_labels()
    if flagged(frame[frame["status"] == "ok"]).any():
        handles.append(plt.Line2D([], [], linestyle="none", marker="o", markerfacecolor="white",
                                  markeredgecolor="black"))
        labels.append(HOLLOW_NOTE)
    return handles, labels


def _hollow_legend(ax: plt.Axes, frame: pd.DataFrame) -> None:
    """The legend, with an entry saying what hollow markers mean where there are some."""
    ax.legend(*_legend_entries(ax, frame), fontsize=7)


def _curves(ax: plt.Axes, frame: pd.DataFrame, x: str, y: str, within: str, scale: float = 1.0) -> None:
    """One line per (model, ``within`` value): successful points joined (hollow where the bench
    marked them shared or unsteady), OOM points as red x on the top edge of the axes. An
    architecture's colour; a marker per series of it (weights, runtime, kernels: told apart at a
    single point too), or per ``within`` value for an architecture of one series; a line style per
    ``within`` value."""
    values = sorted(frame[within].unique())
    series_count = collections.Counter(_arch(frame, model) for model in frame["model"].unique())
    series_of_arch: dict[str, int] = {}
    for model, by_model in frame.groupby("model", sort=False):
        arch = _arch(frame, model)
        series = series_of_arch[arch] = series_of_arch.get(arch, -1) + 1
        for index, value in enumerate(values):
            curve = by_model[by_model[within] == value].sort_values(x)
            ok = curve[curve["status"] == "ok"]
            label = f"{model_label(arch, model)}, {within.replace('_', ' ')}={value}"
            marker = MARKERS[(series if series_count[arch] > 1 else index) % len(MARKERS)]
            ax.plot(ok[x], ok[y] * scale, color=_color(arch), linestyle=LINESTYLES[index % len(LINESTYLES)],
                    marker=marker, label=label)
            _hollow(ax, ok, x, y, scale, _color(arch), marker)
            oom = curve[curve["status"] == "oom"]
            if len(oom):
                ax.plot(oom[x], [1.0] * len(oom), transform=ax.get_xaxis_transform(), linestyle="none",
                        marker="x", color="red", markersize=9, clip_on=False,
                        label=f"{model_label(arch, model)} OOM" if index == 0 else None)
    ax.set_xscale("log", base=2)
    ax.grid(True, alpha=0.3)
    _hollow_legend(ax, frame)


def _title(head: dict, text: str, frame: pd.DataFrame) -> str:
    """The figure's title, the machine, for a run stopped early (by Ctrl-C or its time budget) how
    much of it there is and what stopped it, and how many points were taken on a shared machine
    or with unsteady repeats."""
    compiled = ", compiled step" if head.get("compile") else ""
    stopped_by = head.get("stopped_by")  # results written before it was recorded have none
    reason = f" (stopped by {stopped_by})" if isinstance(stopped_by, str) and stopped_by else ""
    incomplete = (f"; incomplete: {len(frame)} of {head.get('points_planned', '?')} points{reason}"
                  if not bool(head.get("complete", True)) else "")
    ok = frame[frame["status"] == "ok"]
    marked = int(flagged(ok).sum())
    note = f"\n{marked} of {len(ok)} points hollow: shared machine or unsteady repeats (columns shared, unsteady)" \
        if marked else ""
    return f"{text}\n{head.get('device', '')}, {points_dtype(head, ok)}{compiled}{incomplete}{note}"


def points_dtype(head: dict, frame: pd.DataFrame) -> str:
    """The dtype the points ran in: the grid's, or each one with the weight formats that ran in it
    (int4, and int8 on a CPU, run in bfloat16 whatever the grid's dtype)."""
    if "dtype" not in frame or frame["dtype"].nunique() <= 1:
        return str(frame["dtype"].iloc[0]) if "dtype" in frame and len(frame) else str(head.get("dtype", ""))
    formats = frame.groupby("dtype", sort=False)["weights"].unique() if "weights" in frame else None
    return ", ".join(f"{dtype} ({'/'.join(formats[dtype])})" if formats is not None else str(dtype)
                     for dtype in frame["dtype"].unique())


def plot_inference(results: str | Path, output_dir: str | Path | None = None) -> list[Path]:
    """Figs. 5-8 from an inference results file, as PNG and PDF beside it (or in ``output_dir``),
    and the decode step's ratio to the memory-bandwidth limit (``limit_ratio``) where measured."""
    results = bench_results.results_file(results)
    head, frame = read_results(results, "inference")
    output_dir = Path(output_dir) if output_dir else Path(results).parent
    written = []
    specs = [
        ("fig5_memory_vs_length", "gen_len", "peak_mem_bytes", "batch", 2.0**-20, "generated tokens",
         "peak memory (MiB)", "Fig. 5: memory vs generated length"),
        ("fig6_latency_vs_batch", "batch", "latency_s", "gen_len", 1.0, "batch size", "latency (s)",
         "Fig. 6: latency vs batch size"),
        ("fig7_throughput_vs_length", "gen_len", "tokens_per_s", "batch", 1.0, "generated tokens",
         "throughput (tokens/s)", "Fig. 7: throughput vs generated length"),
        ("fig8_throughput_vs_batch", "batch", "tokens_per_s", "gen_len", 1.0, "batch size",
         "throughput (tokens/s)", "Fig. 8: throughput vs batch size"),
    ]
    # Results written before mcsd-bench measured the bandwidth have no limit_ratio; those written
    # before it counted the states (no step_read_bytes) have it over the weights alone.
    with_state = "step_read_bytes" in frame
    if "limit_ratio" in frame:
        specs.append(("decode_limit_ratio", "gen_len", "limit_ratio", "batch", 1.0, "generated tokens",
                      "decode step time / " + ("time to read weights + state" if with_state else "weight-read time"),
                      "Decoding against the memory-bandwidth limit"))
    for name, x, y, within, scale, xlabel, ylabel, title in specs:
        figure, ax = plt.subplots(figsize=(6.4, 4.4))
        _curves(ax, frame, x, y, within, scale)
        ax.set(xlabel=xlabel, ylabel=ylabel, title=_title(head, title, frame))
        if y != "peak_mem_bytes":
            ax.set_yscale("log")
        if y == "limit_ratio":
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.text(0.01, 1.0, " reading the weights" + (" and the state (KV cache)" if with_state else "")
                    + " once per step at the measured bandwidth",
                    transform=ax.get_yaxis_transform(), fontsize=7, va="bottom")
        written += save_figure(figure, output_dir, name)
    return written


def plot_train(results: str | Path, output_dir: str | Path | None = None) -> list[Path]:
    """Training tokens/s, peak memory and MFU vs sequence length, one line per model form."""
    results = bench_results.results_file(results)
    head, frame = read_results(results, "train")
    output_dir = Path(output_dir) if output_dir else Path(results).parent
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.4), layout="constrained")
    for ax, (y, scale, ylabel) in zip(axes, [("tokens_per_s", 1.0, "training tokens/s"),
                                              ("peak_mem_bytes", 2.0**-20, "peak memory (MiB)"),
                                              ("mfu", 100.0, "MFU (% of peak_flops)")]):
        # A line per model form and kind of step: batch_size sequences, or tokens_per_step's (a larger batch).
        smallest = frame.groupby(["model", "form"], sort=False)["batch"].transform("min")
        steps = frame.assign(step=(frame["batch"] > smallest).map({False: "", True: " (tokens_per_step)"}))
        for index, ((model, form, step), curve) in enumerate(steps.groupby(["model", "form", "step"], sort=False)):
            curve = curve.sort_values("seq_len")
            ok = curve[curve["status"] == "ok"]
            arch = _arch(frame, model)
            ax.plot(ok["seq_len"], ok[y] * scale, color=_color(arch), linestyle=LINESTYLES[index % len(LINESTYLES)],
                    marker=MARKERS[index % len(MARKERS)], label=f"{model_label(arch, model)} {form}{step}")
            _hollow(ax, ok, "seq_len", y, scale, _color(arch), MARKERS[index % len(MARKERS)])
            oom = curve[curve["status"] == "oom"]
            if len(oom):  # in its curve's colour, at the top edge; one legend entry for all
                ax.plot(oom["seq_len"], [1.0] * len(oom), transform=ax.get_xaxis_transform(), linestyle="none",
                        marker="x", color=_color(arch), markersize=9, clip_on=False, label="_nolegend_")
        ax.set(xlabel="sequence length", ylabel=ylabel)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    # One legend for the three panels, below them: a legend in each covered its curves.
    handles, labels = _legend_entries(axes[0], frame)
    if (frame["status"] == "oom").any():
        handles.append(plt.Line2D([], [], linestyle="none", marker="x", color="black", markersize=9))
        labels.append(OOM_NOTE)
    figure.legend(handles, labels, loc="outside lower center", ncol=min(4, len(labels)), fontsize=8)
    figure.suptitle(_title(head, "Training: forward + backward + AdamW step", frame))
    return save_figure(figure, output_dir, "train_throughput")
