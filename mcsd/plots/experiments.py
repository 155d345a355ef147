"""How each experiment's result folders are drawn: one definition that the experiments' ``run.sh``
scripts (through ``mcsd-plot experiment``), ``mcsd-plot experiment`` and the figures notebook all
use, so that every route writes the same figures and tables with the same titles and columns."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mcsd.checkpoint import eval_results
from mcsd.checkpoint.bench_results import RESULTS_CSV
from mcsd.errors import MCSDError
from mcsd.evaluation.table2 import table2_markdown
from mcsd.plots.compare import best_rate_jobs, comparison_table, markdown_comparison, plot_comparison
from mcsd.plots.context import load_context_results, markdown_context_table, plot_context
from mcsd.plots.cost import plot_inference, plot_train
from mcsd.plots.dynamics import load_dynamics, plot_training_dynamics
from mcsd.plots.mqar import load_mqar_runs, markdown_mqar_table, plot_mqar
from mcsd.plots.runs import load_csv_runs, markdown_seed_table, markdown_sweep_table, plot_sweep
from mcsd.plots.scaling_fit import draws_path, fit_sweep, markdown_fit_table, plot_fit
from mcsd.plots.tasks import load_task_runs, markdown_task_table, plot_tasks

NOT_RESULTS = ("logs", "trial")  # an experiment's raw runs and its trial runs, beside its committed results
# The comparison's MQAR column comes from this result folder of mqar_converge (trained to a plateau).
COMPARISON_MQAR = ("mqar_converge", "cpu")
# The long-context probe's figure of the main curves (every probe is in context_probe_all).
CONTEXT_CURVES = ["MCSD full", "MCSD slope_only", "MCSD decay_only", "Transformer", "RetNet", "RWKV-4",
                  "Wonderful Matrices"]


@dataclass
class Drawn:
    """What drawing one result folder wrote (``paths``) and the tables to show (``markdown``)."""

    folder: Path
    markdown: str
    paths: list[Path] = field(default_factory=list)


def _sweep(kind: str, name: str, reference: str | None = None, notes: str | None = None, fit: bool = False,
           best_rates: bool = False) -> Callable[[Path], Drawn]:
    """A training sweep's loss curves and tables (``plot_sweep``); ``notes`` names a markdown file
    of the folder shown below the tables when present; ``fit``: the scaling laws fitted too
    (``mcsd-plot scaling fit=true``); ``best_rates``: each curve's runs at its best learning rate
    alone (:func:`mcsd.plots.compare.best_rate_jobs`), not every rate's averaged as seeds."""
    def draw_sweep(folder: Path) -> Drawn:
        rows = load_csv_runs(folder)
        if best_rates:
            rows = rows[rows["run"].str.split("/").str[0].isin(best_rate_jobs(folder))]
        figure = plot_sweep(kind, rows, folder, name, reference)
        markdown = markdown_sweep_table(figure.table)
        if figure.by_seed is not None:
            markdown += "\n" + markdown_seed_table(figure.by_seed)
        if fit:
            fits = fit_sweep(rows, saved=draws_path(folder, name))
            figure.paths += plot_fit(rows, fits, folder, name)
            markdown += "\n" + markdown_fit_table(fits)
        if notes and (folder / notes).is_file():
            markdown += "\n" + (folder / notes).read_text()
        return Drawn(folder, markdown, figure.paths)
    return draw_sweep


def _mqar(name: str) -> Callable[[Path], Drawn]:
    def draw_mqar(folder: Path) -> Drawn:
        figure = plot_mqar(load_mqar_runs(folder), folder, name)
        dynamics = load_dynamics(folder)  # runs with callbacks.training_dynamics on: how they trained
        paths = figure.paths + (plot_training_dynamics(dynamics, folder, f"{name}_dynamics") if len(dynamics) else [])
        return Drawn(folder, markdown_mqar_table(figure.table), paths)
    return draw_mqar


def _tasks(name: str) -> Callable[[Path], Drawn]:
    def draw_tasks(folder: Path) -> Drawn:
        figure = plot_tasks(load_task_runs(folder), folder, name)
        return Drawn(folder, markdown_task_table(figure.table), figure.paths)
    return draw_tasks


def _cost(plot: Callable[[Path], list[Path]]) -> Callable[[Path], Drawn]:
    def draw_cost(folder: Path) -> Drawn:
        results = folder / RESULTS_CSV
        if not results.is_file():
            raise FileNotFoundError(f"{folder} has no {RESULTS_CSV}: give the output_dir of an mcsd-bench run")
        return Drawn(folder, "", plot(results))
    return draw_cost


def _context(folder: Path) -> Drawn:
    """The main curves (those of ``CONTEXT_CURVES`` present) and every probe, side by side."""
    curves, deltas = load_context_results(folder)
    main = [label for label in CONTEXT_CURVES if label in set(deltas["label"])]
    paths = plot_context(*load_context_results(folder, main), folder, "context_probe") if main else []
    paths += plot_context(curves, deltas, folder, "context_probe_all")
    return Drawn(folder, markdown_context_table(deltas), paths)


def _comparison(folder: Path) -> Drawn:
    """The sweep's loss curves, then the table of every measurement (training, MQAR from
    ``COMPARISON_MQAR``, the probe, the benches) and its figure."""
    curves = _sweep("ablation", "compare_architectures", best_rates=True)(folder)
    root = next((parent.parent for parent in folder.resolve().parents if parent.name == "compare_architectures"), None)
    mqar = root.joinpath(*COMPARISON_MQAR) if root is not None else None
    comparison = comparison_table(folder, mqar if mqar is not None and mqar.is_dir() else None)
    return Drawn(folder, markdown_comparison(comparison) + "\n" + curves.markdown,
                 curves.paths + plot_comparison(comparison, folder))


def _table2(folder: Path) -> Drawn:
    """Table 2 with one row per ``<model>/results.json`` of mcsd-eval under ``folder`` (shown, not written)."""
    rows = []
    for results in sorted(folder.glob(f"*/{eval_results.RESULTS_FILE}")):
        summary = eval_results.read(results)
        rows.append((results.parent.name, summary["params"], summary["results"]))
    return Drawn(folder, table2_markdown(rows))


@dataclass(frozen=True)
class Drawing:
    """How an experiment's result folders are drawn: ``draw`` one of them; ``whole``: the
    experiment's own folder is its one result folder (Table 2: a row per subfolder); ``holds``: a
    file every result folder has (a bench's results.csv; its other subfolders are not results)."""

    draw: Callable[[Path], Drawn]
    whole: bool = False
    holds: str | None = None


DRAWINGS: dict[str, Drawing] = {
    "fig4_scaling": Drawing(_sweep("scaling", "fig4_scaling", fit=True)),
    "fig5-8_inference": Drawing(_cost(plot_inference), holds=RESULTS_CSV),
    "edge_decoding": Drawing(_cost(plot_inference), holds=RESULTS_CSV),
    "train_throughput": Drawing(_cost(plot_train), holds=RESULTS_CSV),
    "fig9_ablation": Drawing(_sweep("ablation", "fig9_ablation", "Transformer")),
    "decay_init_study": Drawing(_sweep("ablation", "decay_init_study", "Transformer")),
    "table2_downstream": Drawing(_table2, whole=True),
    "mqar_recall": Drawing(_mqar("mqar_recall")),
    "mqar_converge": Drawing(_mqar("mqar_converge")),
    "long_context": Drawing(_context),
    "compare_architectures": Drawing(_comparison),
    "rwkv_perspectives": Drawing(_sweep("ablation", "rwkv_perspectives", "RWKV-4", notes="perspective_weights.md")),
    "wm_ablation": Drawing(_sweep("ablation", "wm_ablation", "Wonderful Matrices default, attention_every=0")),
    "documents_apart": Drawing(_sweep("ablation", "documents_apart", "Transformer")),
    "mad": Drawing(_tasks("mad")),
    "retrieval": Drawing(_tasks("retrieval")),
}


def result_folders(root: Path, experiment: str) -> list[Path]:
    """``experiment``'s committed result folders under the experiments folder ``root``: its
    subfolders but its raw runs (logs/) and trial runs (trial/)."""
    folder, drawing = root / experiment, DRAWINGS[experiment]
    if not folder.is_dir() or drawing.whole:
        return [folder] if folder.is_dir() else []
    return sorted(path for path in folder.iterdir() if path.is_dir() and path.name not in NOT_RESULTS
                  and (drawing.holds is None or (path / drawing.holds).is_file()))


def experiment_of(folder: Path) -> str:
    """The experiment a result folder belongs to: the name of its parent (the folder above trial/
    for a trial run), or its own for an experiment whose folder is its one result folder."""
    folder = folder.resolve()
    if folder.name in DRAWINGS and DRAWINGS[folder.name].whole:
        return folder.name
    parent = folder.parent.parent if folder.parent.name == "trial" else folder.parent
    if parent.name not in DRAWINGS:
        raise MCSDError(f"{folder} is not a result folder of a known experiment: give experiments/<experiment>/<name> "
                        f"with <experiment> one of {', '.join(DRAWINGS)}")
    return parent.name


def draw(folder: str | Path, experiment: str | None = None) -> Drawn:
    """Draw one result folder the way its experiment's run.sh does."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder: give an experiment's result folder "
                                "(experiments/<experiment>/<name>)")
    experiment = experiment or experiment_of(folder)
    if experiment not in DRAWINGS:
        raise MCSDError(f"unknown experiment {experiment!r}: use one of {', '.join(DRAWINGS)}")
    return DRAWINGS[experiment].draw(folder)


def draw_experiment(root: str | Path, experiment: str) -> Iterator[Drawn]:
    """Draw every committed result folder of ``experiment`` under the experiments folder ``root``."""
    for folder in result_folders(Path(root), experiment):
        yield draw(folder, experiment)
