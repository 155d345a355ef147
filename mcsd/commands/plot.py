"""mcsd-plot: figures from result files and training logs.

    mcsd-plot inference logs/bench/runs/<time>/results.csv   # Figs. 5-8
    mcsd-plot train logs/bench/runs/<time>/results.csv       # training cost
    mcsd-plot scaling logs/train/multiruns/<time>            # Fig. 4, from the sweep's CSV logs
    mcsd-plot scaling experiments/fig4_scaling/tinyshakespeare --fit   # + power laws, intervals, compute multiplier
    mcsd-plot ablation logs/train/multiruns/<time>           # Fig. 9
    mcsd-plot ablation --wandb logs/train/multiruns/<time>   # the same from its offline W&B runs
    mcsd-plot ablation --wandb ENTITY/mcsd --group fig9_ablation/<time>   # the same from W&B online
    mcsd-plot ablation DIR --name decay_init_study --reference Transformer   # + per-seed ratios
    mcsd-plot mqar logs/train/multiruns/<time>               # MQAR accuracy vs width
    mcsd-plot tasks logs/train/multiruns/<time>              # MAD's tasks, retrieval past the training length
    mcsd-plot context logs/probe_context                     # every probe under it, side by side
    mcsd-plot compare experiments/compare_architectures/tinyshakespeare --mqar DIR   # the headline table
    mcsd-plot experiment experiments/fig9_ablation/tinyshakespeare   # a result folder, as its run.sh draws it
    mcsd-plot experiment experiments/fig9_ablation                   # every result folder of the experiment
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from mcsd.commands.app import fail, run_or_exit, unwritable

from mcsd.runtime import require_wandb_login
from mcsd.errors import MCSDError
from mcsd.plots.compare import comparison_table, markdown_comparison, plot_comparison
from mcsd.plots.context import load_context_results, markdown_context_table, plot_context
from mcsd.plots.cost import plot_inference, plot_train
from mcsd.plots.experiments import DRAWINGS, draw, draw_experiment
from mcsd.plots.mqar import load_mqar_runs, markdown_mqar_table, plot_mqar
from mcsd.plots.runs import (check_one_source, load_csv_runs, load_offline_wandb_runs, load_wandb_runs, markdown_seed_table,
                             markdown_sweep_table, plot_sweep)
from mcsd.plots.scaling_fit import fit_sweep, markdown_fit_table, plot_fit
from mcsd.plots.tasks import load_task_runs, markdown_task_table, plot_tasks

COSTS = {"inference": plot_inference, "train": plot_train}
SWEEPS = ("scaling", "ablation")
RUN_TABLES = ("mqar", "tasks", "context", "compare")
RUN_FIGURES = {  # kind: (the folder it reads, its loader, figure, table, default name)
    "mqar": ("an experiment=mqar_recall sweep", load_mqar_runs, plot_mqar, markdown_mqar_table, "mqar_recall"),
    "tasks": ("an experiment=mad or experiment=retrieval sweep", load_task_runs, plot_tasks, markdown_task_table,
              "tasks"),
}


def _experiment(args: argparse.Namespace) -> list:
    """``mcsd-plot experiment``: one result folder, or every one of an experiment's folder."""
    if args.source is None:
        raise MCSDError("mcsd-plot experiment needs a result folder: mcsd-plot experiment experiments/<experiment>/<name>")
    if args.out is not None:
        raise MCSDError("--out: mcsd-plot experiment writes into the result folder it draws; leave --out out")
    folder = Path(args.source).resolve()
    if args.name is None and folder.name in DRAWINGS and not DRAWINGS[folder.name].whole:
        drawn = list(draw_experiment(folder.parent, folder.name))  # an experiment's folder: each result in it
    else:
        drawn = [draw(folder, args.name)]
    for one in drawn:
        print(f"{one.folder}\n{one.markdown}" if one.markdown else one.folder)
    return [path for one in drawn for path in one.paths]


def _check_fit(args: argparse.Namespace) -> None:
    """``--fit`` and ``--samples`` that cannot work, refused before any figure is drawn."""
    if args.fit and args.kind != "scaling":
        raise MCSDError("--fit fits scaling laws: use it with mcsd-plot scaling")
    if args.samples < 1:
        raise MCSDError(f"--samples {args.samples} must be a positive number of bootstrap samples (e.g. --samples 1000)")


def _plot(args: argparse.Namespace) -> list:
    _check_fit(args)
    if args.wandb and args.kind not in ("scaling", "ablation"):
        raise MCSDError(f"--wandb draws training sweeps (mcsd-plot scaling, ablation): mcsd-plot {args.kind} reads its "
                        f"folder (mcsd-plot {args.kind} DIR)")
    if args.kind == "experiment":
        return _experiment(args)
    if args.kind in COSTS:
        if args.source is None:
            raise MCSDError(f"mcsd-plot {args.kind} needs a results file: mcsd-plot {args.kind} RESULTS.csv")
        return COSTS[args.kind](args.source, args.out)
    if args.kind in RUN_FIGURES:
        folder, load, plot, table, name = RUN_FIGURES[args.kind]
        if args.source is None:
            raise MCSDError(f"mcsd-plot {args.kind} needs the folder of {folder}")
        figure = plot(load(args.source), args.out or args.source, args.name or name)
        print(table(figure.table))
        return figure.paths
    if args.kind == "compare":
        if args.source is None:
            raise MCSDError("mcsd-plot compare needs the folder of an experiments/compare_architectures run")
        comparison = comparison_table(args.source, args.mqar, args.mqar_anchor)
        print(markdown_comparison(comparison))
        return plot_comparison(comparison, args.out or args.source, args.name or "architectures_compared")
    if args.kind == "context":
        if args.source is None:
            raise MCSDError("mcsd-plot context needs a folder of mcsd-probe context runs")
        curves, deltas = load_context_results(args.source, args.curves.split(",") if args.curves else None)
        print(markdown_context_table(deltas))
        return plot_context(curves, deltas, args.out or args.source, args.name or "context_probe")
    if args.wandb and Path(args.wandb).expanduser().is_dir():  # offline runs on this machine
        rows, default_out = load_offline_wandb_runs(Path(args.wandb).expanduser()), args.wandb
        check_one_source(args.kind, rows)
    elif args.wandb:
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", args.wandb):
            raise MCSDError(f"--wandb {args.wandb} is neither a folder (of offline W&B runs) nor ENTITY/PROJECT: give one")
        if not args.group:
            raise MCSDError("--wandb ENTITY/PROJECT needs --group: the W&B group of the sweep "
                            "(<experiment_name>/<its folder under logs/train/multiruns>)")
        require_wandb_login("--wandb")
        rows, default_out = load_wandb_runs(args.wandb, args.group), "."
        check_one_source(args.kind, rows)
    elif args.source:
        rows, default_out = load_csv_runs(args.source), args.source
    else:
        raise MCSDError(f"mcsd-plot {args.kind} needs a sweep folder, or --wandb ENTITY/PROJECT --group GROUP")
    fits = fit_sweep(rows, samples=args.samples) if args.fit else None  # a sweep it cannot fit: refused before drawing
    figure = plot_sweep(args.kind, rows, args.out or default_out, args.name, args.reference)
    print(markdown_sweep_table(figure.table))
    if figure.by_seed is not None:
        print(markdown_seed_table(figure.by_seed))
    if fits is None:
        return figure.paths
    print(markdown_fit_table(fits))
    return [*figure.paths, *plot_fit(rows, fits, args.out or default_out, args.name or "fig4_scaling")]


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``mcsd-plot``."""
    parser = argparse.ArgumentParser(prog="mcsd-plot", description="Draw the paper's figures from result files.")
    parser.add_argument("kind", choices=[*COSTS, *SWEEPS, *RUN_TABLES, "experiment"], help="which figures")
    parser.add_argument("source", nargs="?", help="results.csv/json of mcsd-bench, or the folder of a training sweep")
    parser.add_argument("--out", default=None, help="folder for the figures (default: beside the source)")
    parser.add_argument("--wandb", default=None, metavar="FOLDER|ENTITY/PROJECT",
                        help="read the sweep from W&B instead: a folder of offline runs, or a project (with --group)")
    parser.add_argument("--group", default=None, help="the W&B group of the sweep (with --wandb)")
    parser.add_argument("--name", default=None, help="file stem and title of a sweep's figure (default: fig4_scaling "
                        "or fig9_ablation); experiment: the experiment (default: the result folder's parent)")
    parser.add_argument("--reference", default=None, metavar="CURVE",
                        help="a curve label (e.g. Transformer): the per-seed table gives every curve's ratio to it")
    parser.add_argument("--curves", default=None, metavar="LABEL,LABEL",
                        help="context: only the probes of these models (labels such as 'MCSD full,Transformer')")
    parser.add_argument("--mqar", default=None, metavar="DIR",
                        help="compare: the MQAR sweep folder to take accuracy from (default: SOURCE/mqar)")
    parser.add_argument("--mqar-anchor", default="transformer", metavar="ARCH",
                        help="compare: MQAR accuracy is read at the hardest (T, K) where this architecture still "
                             "reaches 0.99 (default: transformer)")
    parser.add_argument("--fit", action="store_true",
                        help="scaling: fit L(N, D) = E + A N^-alpha + B D^-beta per architecture, with bootstrap "
                             "intervals and the compute multiplier over the Transformer (<name>_fit.png, _fit.md)")
    parser.add_argument("--samples", type=int, default=1000, help="--fit: bootstrap samples (default 1000)")
    args = parser.parse_intermixed_args(argv)  # options may come before the source (sweep.sh)
    source = Path(args.source) if args.source else None
    out = Path(args.out) if args.out else source if source and source.is_dir() else source.parent if source else None
    reason = unwritable(out) if out is not None and (args.out or source.exists()) else None
    if reason is not None:
        fail("mcsd-plot", f"{'--out ' + args.out if args.out else str(out)} is not writable: {reason}; "
                          "give --out DIR, a folder this user can write to")
    paths = run_or_exit("mcsd-plot", lambda: _plot(args))
    print("\n".join(str(path) for path in paths))


if __name__ == "__main__":
    main()
