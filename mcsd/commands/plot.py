"""mcsd-plot: figures from result files and training logs.

    mcsd-plot inference source=logs/bench/runs/<time>/results.csv   # Figs. 5-8
    mcsd-plot train source=logs/bench/runs/<time>/results.csv       # training cost
    mcsd-plot scaling source=logs/train/multiruns/<time>            # Fig. 4, from the sweep's CSV logs
    mcsd-plot scaling source=experiments/fig4_scaling/tinyshakespeare fit=true   # + power laws, intervals, compute multiplier
    mcsd-plot ablation source=logs/train/multiruns/<time>           # Fig. 9
    mcsd-plot ablation wandb=logs/train/multiruns/<time>            # the same from its offline W&B runs
    mcsd-plot ablation wandb=ENTITY/mcsd group=fig9_ablation/<time>   # the same from W&B online
    mcsd-plot ablation source=DIR name=decay_init_study reference=Transformer   # + per-seed ratios
    mcsd-plot mqar source=logs/train/multiruns/<time>               # MQAR accuracy vs width
    mcsd-plot tasks source=logs/train/multiruns/<time>              # MAD's tasks, retrieval past the training length
    mcsd-plot context source=logs/probe_context                     # every probe under it, side by side
    mcsd-plot compare source=experiments/compare_architectures/tinyshakespeare mqar=DIR   # the headline table
    mcsd-plot experiment source=experiments/fig9_ablation/tinyshakespeare   # a result folder, as its run.sh draws it
    mcsd-plot experiment source=experiments/fig9_ablation                   # every result folder of the experiment

A Hydra app as every command (conf/plot.yaml: ``mcsd-plot --help`` lists the settings); the
first argument names the figures.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mcsd.commands.app import fail, hydra_app, unwritable
from mcsd.runtime import require_wandb_login
from mcsd.errors import MCSDError
from mcsd.plots.compare import comparison_table, markdown_comparison, plot_comparison
from mcsd.plots.context import load_context_results, markdown_context_table, plot_context
from mcsd.plots.cost import plot_inference, plot_train
from mcsd.plots.experiments import DRAWINGS, draw, draw_experiment
from mcsd.plots.mqar import load_mqar_runs, markdown_mqar_table, plot_mqar
from mcsd.plots.runs import (check_one_source, load_csv_runs, load_offline_wandb_runs, load_wandb_runs, markdown_seed_table,
                             markdown_sweep_table, plot_sweep)
from mcsd.plots.scaling_fit import draws_path, fit_sweep, markdown_fit_table, plot_fit
from mcsd.plots.tasks import load_task_runs, markdown_task_table, plot_tasks

COSTS = {"inference": plot_inference, "train": plot_train}
SWEEPS = ("scaling", "ablation")
RUN_TABLES = ("mqar", "tasks", "context", "compare")
KINDS = (*COSTS, *SWEEPS, *RUN_TABLES, "experiment")  # what the first argument (kind) names
RUN_FIGURES = {  # kind: (the folder it reads, its loader, figure, table, default name)
    "mqar": ("an experiment=mqar_recall sweep", load_mqar_runs, plot_mqar, markdown_mqar_table, "mqar_recall"),
    "tasks": ("an experiment=mad or experiment=retrieval sweep", load_task_runs, plot_tasks, markdown_task_table,
              "tasks"),
}


def _experiment(args: DictConfig) -> list:
    """``mcsd-plot experiment``: one result folder, or every one of an experiment's folder."""
    if args.source is None:
        raise MCSDError("mcsd-plot experiment needs a result folder: mcsd-plot experiment "
                        "source=experiments/<experiment>/<name>")
    if args.out is not None:
        raise MCSDError("out: mcsd-plot experiment writes into the result folder it draws; leave out= out")
    folder = Path(args.source).resolve()
    if args.name is None and folder.name in DRAWINGS and not DRAWINGS[folder.name].whole:
        drawn = list(draw_experiment(folder.parent, folder.name))  # an experiment's folder: each result in it
    else:
        drawn = [draw(folder, args.name)]
    for one in drawn:
        print(f"{one.folder}\n{one.markdown}" if one.markdown else one.folder)
    return [path for one in drawn for path in one.paths]


def _check_settings(args: DictConfig) -> None:
    """Settings that cannot work, refused before any figure is drawn."""
    if args.kind not in KINDS:
        raise MCSDError(f"kind={args.kind} is not a kind of figure: use one of {', '.join(KINDS)} "
                        f"(mcsd-plot {KINDS[0]} source=...)")
    if not isinstance(args.fit, bool):
        raise MCSDError(f"fit={args.fit} must be true or false")
    if args.fit and args.kind != "scaling":
        raise MCSDError("fit=true fits scaling laws: use it with mcsd-plot scaling")
    if isinstance(args.samples, bool) or not isinstance(args.samples, int) or args.samples < 1:
        raise MCSDError(f"samples={args.samples} must be a positive number of bootstrap samples (e.g. samples=1000)")
    if args.curves is not None and not (OmegaConf.is_list(args.curves) or isinstance(args.curves, str)):
        raise MCSDError(f"curves={args.curves} must be a list of labels: curves=[\"MCSD full\",Transformer]")


def _plot(args: DictConfig) -> list:
    _check_settings(args)
    if args.wandb and args.kind not in ("scaling", "ablation"):
        raise MCSDError(f"wandb draws training sweeps (mcsd-plot scaling, ablation): mcsd-plot {args.kind} reads its "
                        f"folder (mcsd-plot {args.kind} source=DIR)")
    if args.kind == "experiment":
        return _experiment(args)
    if args.kind in COSTS:
        if args.source is None:
            raise MCSDError(f"mcsd-plot {args.kind} needs a results file: mcsd-plot {args.kind} source=RESULTS.csv")
        return COSTS[args.kind](args.source, args.out)
    if args.kind in RUN_FIGURES:
        folder, load, plot, table, name = RUN_FIGURES[args.kind]
        if args.source is None:
            raise MCSDError(f"mcsd-plot {args.kind} needs the folder of {folder}: mcsd-plot {args.kind} source=DIR")
        figure = plot(load(args.source), args.out or args.source, args.name or name)
        print(table(figure.table))
        return figure.paths
    if args.kind == "compare":
        if args.source is None:
            raise MCSDError("mcsd-plot compare needs the folder of an experiments/compare_architectures run: "
                            "mcsd-plot compare source=DIR")
        comparison = comparison_table(args.source, args.mqar, args.mqar_anchor)
        print(markdown_comparison(comparison))
        return plot_comparison(comparison, args.out or args.source, args.name or "architectures_compared")
    if args.kind == "context":
        if args.source is None:
            raise MCSDError("mcsd-plot context needs a folder of mcsd-probe context runs: mcsd-plot context source=DIR")
        curves, deltas = load_context_results(args.source, _labels(args.curves))
        print(markdown_context_table(deltas))
        return plot_context(curves, deltas, args.out or args.source, args.name or "context_probe")
    if args.wandb and Path(args.wandb).expanduser().is_dir():  # offline runs on this machine
        rows, default_out = load_offline_wandb_runs(Path(args.wandb).expanduser()), args.wandb
        check_one_source(args.kind, rows)
    elif args.wandb:
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", args.wandb):
            raise MCSDError(f"wandb={args.wandb} is neither a folder (of offline W&B runs) nor ENTITY/PROJECT: give one")
        if not args.group:
            raise MCSDError("wandb=ENTITY/PROJECT needs group=: the W&B group of the sweep "
                            "(<experiment_name>/<its folder under logs/train/multiruns>)")
        require_wandb_login("wandb")
        rows, default_out = load_wandb_runs(args.wandb, args.group), "."
        check_one_source(args.kind, rows)
    elif args.source:
        rows, default_out = load_csv_runs(args.source), args.source
    else:
        raise MCSDError(f"mcsd-plot {args.kind} needs a sweep folder (source=DIR), or wandb=ENTITY/PROJECT group=GROUP")
    out, name = args.out or default_out, args.name or "fig4_scaling"
    # A sweep it cannot fit: refused before drawing.
    fits = fit_sweep(rows, samples=args.samples, saved=draws_path(out, name)) if args.fit else None
    figure = plot_sweep(args.kind, rows, out, args.name, args.reference)
    print(markdown_sweep_table(figure.table))
    if figure.by_seed is not None:
        print(markdown_seed_table(figure.by_seed))
    if fits is None:
        return figure.paths
    print(markdown_fit_table(fits))
    return [*figure.paths, *plot_fit(rows, fits, out, name)]


def _labels(curves: Any) -> list[str] | None:
    """``curves``: a list of labels (a lone label: a list of one)."""
    if curves is None:
        return None
    return [str(label) for label in curves] if OmegaConf.is_list(curves) else [str(curves)]


def draw_figures(cfg: DictConfig) -> list:
    """Draw the figures ``cfg`` asks for (its ``kind``), print their tables; return their paths."""
    source = Path(cfg.source) if cfg.source else None
    out = Path(cfg.out) if cfg.out else source if source and source.is_dir() else source.parent if source else None
    reason = unwritable(out) if out is not None and (cfg.out or source.exists()) else None
    if reason is not None:
        raise MCSDError(f"{'out=' + cfg.out if cfg.out else str(out)} is not writable: {reason}; give out=DIR, a "
                        "folder this user can write to")
    paths = _plot(cfg)
    print("\n".join(str(path) for path in paths))
    return paths


@hydra_app("mcsd-plot", "plot")
def _plot_main(cfg: DictConfig) -> None:
    draw_figures(cfg)


# The settings mcsd-plot took as --options before it was a Hydra app: named in the refusal of one.
OPTIONS = ("out", "wandb", "group", "name", "reference", "curves", "mqar", "mqar-anchor", "fit", "samples")


def main() -> None:
    """Entry point of ``mcsd-plot``: the first argument names the figures (``kind``), Hydra reads the rest."""
    if len(sys.argv) > 1 and "=" not in sys.argv[1] and not sys.argv[1].startswith("-"):
        sys.argv[1] = f"kind={sys.argv[1]}"
    elif not any(argument.startswith(("kind=", "--help", "-h")) for argument in sys.argv[1:]):
        fail("mcsd-plot", f"name the figures first: mcsd-plot {{{','.join(KINDS)}}} source=...")
    old_style = [argument for argument in sys.argv[1:] if argument.startswith("--") and argument.lstrip("-").split("=")[0]
                 in OPTIONS]
    if old_style:
        name = old_style[0].lstrip("-").split("=")[0]
        fail("mcsd-plot", f"{old_style[0]}: mcsd-plot takes settings as key=value, as every command: "
                          f"{name.replace('-', '_')}=... (mcsd-plot --help lists them)")
    bare = [argument for argument in sys.argv[2:] if "=" not in argument and not argument.startswith("-")]
    if bare:
        fail("mcsd-plot", f"{bare[0]}: mcsd-plot takes the folder or file to draw as a setting: source={bare[0]}")
    _plot_main()


if __name__ == "__main__":
    main()
