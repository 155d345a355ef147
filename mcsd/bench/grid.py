"""The bench's loop (what ``mcsd-bench`` runs): its plan's points (:mod:`mcsd.bench.plan`), each
measured by the runner (:mod:`mcsd.bench.runner`) on a machine checked for other work
(:mod:`mcsd.bench.load`) within a time budget, its rows written after every point
(:mod:`mcsd.checkpoint.bench_results`), Ctrl-C stopping after the point under way.

Every point runs after a warm-up; on a CPU each point runs in a fresh child process so
that peak resident memory belongs to that point alone. A point that fails is a row of its own
(``status`` oom or error, with its one-line ``reason``) and the grid goes on. Results:
results.csv and results.json (with a header naming the machine), written after every point, in
the run directory.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import platform
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from mcsd.bench.limits import matmul_peak_flops, read_bandwidth_bytes_per_s
from mcsd.bench.load import BUSY_MACHINE, SPREAD_LIMIT, check_machine, other_cores, read_clock
from mcsd.bench.peaks import mfu_peak
from mcsd.bench.plan import grid_problems, models_of, plan, point_work
from mcsd.bench.runner import run_point
from mcsd.checkpoint import bench_results
from mcsd.errors import MCSDError
from mcsd.files import replace_earlier_results
from mcsd.jobs import CTRL_C, run_jobs
from mcsd.models import registry
from mcsd.precision import DTYPES, auto_dtype, dtype_name
from mcsd.runtime import apply_threads, git_commit, interrupted, require_wandb_login

log = logging.getLogger("mcsd.bench")
MODES = bench_results.MODES


def _check(cfg: DictConfig) -> None:
    if cfg.mode not in MODES:
        raise MCSDError(f"mode={cfg.mode!r} is unknown: use inference or train")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise MCSDError(f"device={cfg.device} but no GPU is visible: use device=cpu (e.g. bench=cpu_quick)")
    problems = grid_problems(cfg)  # imports fla's kernels (seconds) where the grid asks for them
    if problems:
        raise MCSDError("\n".join(problems))
    if cfg.busy_machine not in BUSY_MACHINE:
        raise MCSDError(f"busy_machine={cfg.busy_machine!r} is unknown: use {', '.join(BUSY_MACHINE)}")
    budget = cfg.get("time_budget_s")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0):
        raise MCSDError(f"time_budget_s={budget} must be a number of seconds above 0, or null (no budget)")
    if cfg.mode == "train" and cfg.train.batch_size is None and not cfg.train.tokens_per_step:
        raise MCSDError("train.batch_size=null and train.tokens_per_step=null leave no training point: set either")
    if cfg.dtype not in ("auto", *DTYPES):
        raise MCSDError(f"dtype={cfg.dtype!r} is unknown: use auto or one of {', '.join(DTYPES)}")
    if cfg.cuda_graphs and not cfg.device.startswith("cuda"):
        raise MCSDError(f"cuda_graphs=true replays CUDA graphs, which device={cfg.device} has not: set cuda_graphs=false")
    if cfg.wandb.enabled and not cfg.wandb.offline:
        require_wandb_login("wandb")
    for entry in models_of(cfg):
        if entry not in registry.architectures() and not Path(entry).expanduser().exists():
            raise MCSDError(f"models: {entry!r} is neither a registered architecture ({', '.join(registry.architectures())}) "
                            "nor a saved model (a model folder, an mcsd-train run directory or a .ckpt) nor a run's config YAML")


def header(cfg: DictConfig) -> dict[str, Any]:
    """What machine and software the results come from."""
    device = torch.cuda.get_device_name(torch.device(cfg.device)) if cfg.device.startswith("cuda") else (
        f"{platform.processor() or platform.machine()} CPU, {cfg.threads or torch.get_num_threads()} threads")
    return {"mode": cfg.mode, "device": device, "dtype": cfg.dtype, "torch": torch.__version__,
            "git_commit": git_commit(), "bench": cfg.name, "compile": cfg.compile, "cuda_graphs": cfg.cuda_graphs}


def _measure(cfg: DictConfig, head: dict[str, Any], points: list, to_measure: list, rows: list[dict[str, Any]],
             output_dir: Path, isolate: bool, wandb_run: Any) -> tuple[Path, Path, bool]:
    """Measure ``to_measure``'s points into ``rows`` (each written as it is measured, and logged to
    ``wandb_run``, a :class:`~mcsd.training.dashboard.MeasurementRun`, with ``wandb.enabled``); the
    result files and whether Ctrl-C stopped it."""
    budget = PointBudget(cfg.time_budget_s)

    def may_start(point: tuple[dict[str, Any], dict[str, Any]]) -> str | None:
        labels, arguments = point
        if budget.allows(arguments):
            return None
        log.warning("time_budget_s=%s: the next point (%s) would end past it (about %.0f s more after %.0f s): "
                    "the grid stops here, %d of %d points measured (complete=false)", cfg.time_budget_s,
                    " ".join(f"{key}={value}" for key, value in labels.items()), budget.estimate(arguments),
                    budget.elapsed(), measured(rows, points), len(points))
        return f"time_budget_s={cfg.time_budget_s}"

    def measure_one(point: tuple[dict[str, Any], dict[str, Any]], bar: Any) -> None:
        labels, arguments = point
        # The machine's limit right before each point (this process is idle while a point runs):
        # on a shared machine it moves by a third between minutes, so each point has its own.
        limit = (matmul_peak_flops(cfg.device, cfg.dtype, cfg.train.peak_matmul_size) if cfg.mode == "train"
                 else read_bandwidth_bytes_per_s(cfg.device))
        start = read_clock()
        began = time.monotonic()
        result = run_point(cfg.mode, arguments, isolate, cfg.memory_limit_mb, cfg.threads)
        result = {**result, "point_s": time.monotonic() - began, "git_commit": head["git_commit"],
                  "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        budget.record(arguments, result["point_s"])
        others = other_cores(start, read_clock())  # the point's own process and its children left out
        if others is not None:
            result = {**result, "other_cores": others, "shared": others > cfg.busy_cores}
        peak = mfu_peak(cfg.device.split(":")[0], device_name(cfg.device), cfg.dtype, limit) if cfg.mode == "train" else None
        rows.append(_row(cfg.mode, labels, result, limit, peak))
        bench_results.write(output_dir, head, rows)  # after every point: a crash or a kill loses none measured
        if cfg.wandb.enabled:
            point_name = "/".join(f"{key}={value}" for key, value in labels.items())
            wandb_run.record(rows[-1], {f"tokens_per_s/{point_name}": rows[-1].get("tokens_per_s")})

    outcome = run_jobs(to_measure, measure_one, desc=f"mcsd-bench {cfg.mode}", each="point", unit="point",
                       done=len(points) - len(to_measure), may_start=may_start)
    head["stopped_by"] = outcome.stopped_by
    head["complete"] = measured(rows, points) == len(points)
    json_path, csv_path = bench_results.write(output_dir, head, rows)
    return json_path, csv_path, outcome.stopped_by == CTRL_C


def bench(cfg: DictConfig) -> Path:
    """Run the grid of ``cfg`` and write its results; return the CSV's path."""
    _check(cfg)
    if cfg.dtype == "auto":  # as every command reads it (mcsd.precision.auto_dtype); the rows record the dtype it chose
        cfg.dtype = dtype_name(auto_dtype(cfg.device))
    if isinstance(cfg.threads, str):  # threads=auto (not through the command): a number, for the points too
        apply_threads("mcsd-bench", cfg)
    isolate = cfg.isolate if cfg.isolate is not None else not cfg.device.startswith("cuda")
    if cfg.threads:  # the peak and the bandwidth on the points' own thread count
        torch.set_num_threads(cfg.threads)
    points = plan(cfg)
    output_dir = Path(cfg.output_dir)
    head = {**header(cfg), "complete": False, "points_planned": len(points), "stopped_by": None}
    replace_earlier_results(output_dir, list(bench_results.RESULT_FILES), "mcsd-bench", cfg.get("overwrite", False),
                            resume="resume=true to keep its rows and measure only the points they lack",
                            resuming=bool(cfg.get("resume")))
    rows = bench_results.resumed_rows(output_dir, head) if cfg.get("resume") else []
    to_measure = [(labels, arguments) for labels, arguments in points if not any(bench_results.is_row_of(row, labels) for row in rows)]
    if rows:
        log.info("resume=true: %d of the %d points already measured in %s, %d to measure", len(points) - len(to_measure),
                 len(points), output_dir, len(to_measure))
    head["other_cores_before"] = check_machine(cfg)
    # Imported here, after the checks and the plan: a grid refused is refused before Lightning's,
    # W&B's and pandas' imports (seconds).
    import pandas as pd

    from mcsd.training.dashboard import MeasurementRun

    models = [str(model) for model in cfg.get("models") or []]
    wandb_run = MeasurementRun("bench", cfg.wandb, head, output_dir, models) if cfg.wandb.enabled else contextlib.nullcontext()
    with wandb_run:
        json_path, csv_path, stopped = _measure(cfg, head, points, to_measure, rows, output_dir, isolate, wandb_run)
        if cfg.wandb.enabled:
            wandb_run.table(f"bench/{cfg.mode}", pd.read_csv(csv_path))
            wandb_run.record({}, {"points_measured": measured(rows, points), "points_planned": len(points),
                                  "complete": head["complete"]})
        if stopped:
            interrupted("mcsd-bench", f"kept the {measured(rows, points)} of {len(points)} points measured in {csv_path} "
                        f"and {json_path.name} (complete=false; mcsd-plot {cfg.mode} draws them; resume=true measures "
                        "the rest)")
    shared = [row for row in rows if row.get("shared")]
    unsteady = [row for row in rows if row.get("unsteady")]
    if shared:
        log.warning("%d of %d points ran while other work kept more than %s cores busy (column other_cores): their "
                    "times are the shared machine's, not this one's", len(shared), len(rows), cfg.busy_cores)
    if unsteady:
        log.warning("%d of %d points' repeats spread by more than %.0f%% of their median (column unsteady): measure "
                    "them again", len(unsteady), len(rows), 100 * SPREAD_LIMIT)
    print(f"results: {csv_path} and {json_path}\nplot: mcsd-plot {cfg.mode} source={csv_path}", flush=True)
    return csv_path


class PointBudget:
    """``time_budget_s``: the grid starts a point only when the time spent so far and the point's
    estimate fit in it. The estimate scales the seconds per unit of :func:`point_work` of the
    latest point of the same model (else of any model) to this point's work; the first point of
    all is always run. ``None``: no budget."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds, self.started = seconds, time.monotonic()
        self.rates: dict[str, float] = {}  # seconds per unit of work, by model

    @staticmethod
    def _model(arguments: dict[str, Any]) -> str:
        return json.dumps(arguments["model_cfg"], sort_keys=True, default=str)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def estimate(self, arguments: dict[str, Any]) -> float:
        rate = self.rates.get(self._model(arguments), max(self.rates.values(), default=0.0))
        return rate * point_work(arguments)

    def allows(self, arguments: dict[str, Any]) -> bool:
        return self.seconds is None or not self.rates or self.elapsed() + self.estimate(arguments) <= self.seconds

    def record(self, arguments: dict[str, Any], seconds: float) -> None:
        self.rates[self._model(arguments)] = seconds / point_work(arguments)


def device_name(device: str) -> str:
    """The GPU's name (``torch.cuda.get_device_name``), or ``cpu``."""
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"


def _row(mode: str, labels: dict[str, Any], result: dict[str, Any], limit: float,
         peak: tuple[float, str] | None) -> dict[str, Any]:
    """A point's row: its labels, its measurement, and its use of the machine's ``limit`` (the
    measured matmul peak or read bandwidth); in training, MFU over ``peak`` (FLOP/s, source:
    :func:`mcsd.bench.peaks.mfu_peak`)."""
    row = {**labels, **result}
    if mode == "train" and result["status"] == "ok":
        row["matmul_peak_flops"] = limit
        row["peak_flops"], row["peak_source"] = peak
        row["mfu"] = result["model_flops"] / result["step_s"] / row["peak_flops"]  # CausalLM.training_flops
    if mode == "inference" and result["status"] == "ok":  # a decoding step over the time to read what it must once
        row["read_bandwidth_bytes_per_s"] = limit
        row["limit_ratio"] = result["decode_s_per_token"] / (result["step_read_bytes"] / limit)
    notes = "".join([f", shared with {row['other_cores']:.1f} cores of other work" if row.get("shared") else "",
                     ", unsteady repeats" if row.get("unsteady") else ""])
    log.info("%s: %s%s", " ".join(f"{key}={value}" for key, value in labels.items()),
             f"{row['tokens_per_s']:.0f} tokens/s, peak {row['peak_mem_bytes'] / 2**20:.0f} MiB"
             if result["status"] == "ok" else f"{result['status']} ({result['reason']})", notes)
    return row


def measured(rows: list[dict[str, Any]], points: list[tuple[dict[str, Any], dict[str, Any]]]) -> int:
    """How many of the grid's ``points`` ``rows`` measure."""
    return bench_results.measured(rows, [labels for labels, _ in points])
