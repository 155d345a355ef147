"""The end of a sweep (``mcsd-train -m ...``): one summary instead of its last job's lines.

Every job writes ``result.json`` into its folder, saying how it ended (finished with its final
validation and test loss and perplexity, diverged at a step, refused a setting and why,
interrupted, or failed), and a job that did not finish never stops the jobs after it nor a
job beside it (:mod:`mcsd.commands.app`). When Hydra has run every job, :class:`SweepSummary`
prints the sweep's folder, a line per job (what the job overrode that the others did not, and
how it ended) and the command that draws the sweep, and ends the command with a non-zero exit
status when a job did not finish.
"""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from mcsd.checkpoint.run_folder import DIVERGED, FAILED, FINISHED, HYDRA_DIR, INTERRUPTED, REFUSED, RunFolder
from mcsd.runtime import sync_command

# The config groups whose choices tell a sweep of tasks (MAD's, retrieval's) from one of models on one corpus.
_TASK_SETTINGS = ("task", "data")


def jobs_of(sweep_dir: Path) -> list[Path]:
    """The job folders of a sweep, in job order."""
    return sorted((path for path in sweep_dir.iterdir() if path.is_dir() and path.name.isdigit()),
                  key=lambda path: int(path.name))


def _end(result: dict[str, Any] | None) -> str:
    """How a job ended, as its summary line says it."""
    if result is None:
        return "no result (it did not finish)"
    status = result["status"]
    if status == DIVERGED:
        return f"diverged at step {result.get('diverged_at_step')} (no result)"
    if status != FINISHED:
        return f"{status}: {result.get('reason') or 'no reason recorded'}"
    if "val_ppl" not in result:  # a job of another command (mcsd-bench, mcsd-eval, ...): its results are its own
        return "finished"
    text = "val ppl " + ("not finite" if result.get("val_ppl") is None else f"{result['val_ppl']:.2f}")
    if result.get("test_ppl") is not None:
        text += f", test ppl {result['test_ppl']:.2f}"
    return text


def _plot_command(sweep_dir: Path, overrides: dict[Path, list[str]]) -> str:
    """The plot that fits the sweep: one whose jobs differ in their task or data (MAD's tasks,
    retrieval's) is drawn task by task (``mcsd-plot tasks``); one of models, seeds or sizes on one
    corpus as an ablation or a scaling law."""
    choices = [RunFolder(job).choices() or {} for job in overrides]
    if any(choice.get("data") == "mqar" for choice in choices):
        return f"plot: mcsd-plot mqar source={sweep_dir} (accuracy by model width)"
    if any(len({choice.get(group) for choice in choices}) > 1 for group in _TASK_SETTINGS):
        return f"plot: mcsd-plot tasks source={sweep_dir} (each task's result by architecture)"
    return f"plot: mcsd-plot ablation source={sweep_dir} (or mcsd-plot scaling source={sweep_dir} for a sweep of sizes)"


def summary(sweep_dir: Path, task_name: str) -> str:
    """The sweep's folder, each job's own overrides and how it ended, and the plot command."""
    jobs = jobs_of(sweep_dir)
    overrides = {job: RunFolder(job).overrides() or [] for job in jobs}
    shared = set.intersection(*(set(values) for values in overrides.values())) if overrides else set()
    lines = [f"sweep: {sweep_dir} ({len(jobs)} job{'s' if len(jobs) != 1 else ''})"]
    for job in jobs:
        own = " ".join(value for value in overrides[job] if value not in shared) or "(the sweep's settings)"
        lines.append(f"  job {job.name}: {own}: {_end(RunFolder(job).result())}")
    offline = sorted(sweep_dir.glob("*/wandb/offline-run-*"))
    if offline:
        lines.append(f"W&B: {len(offline)} offline run folder{'s' if len(offline) != 1 else ''}: upload them with "
                     f"`{sync_command([sweep_dir / '*' / 'wandb' / 'offline-run-*'])}`")
    if task_name == "train":
        lines.append(_plot_command(sweep_dir, overrides))
    return "\n".join(lines)


def exit_status(results: list[dict[str, Any] | None]) -> int:
    """The sweep command's exit status: 0 when every job finished; 130 when one was interrupted;
    else 2 when each job that did not finish was refused or diverged (a setting that cannot
    work), 1 when one failed otherwise."""
    ends = [None if result is None else result["status"] for result in results]
    if all(end == FINISHED for end in ends):
        return 0
    if INTERRUPTED in ends:
        return 128 + signal.SIGINT
    return 1 if FAILED in ends or None in ends else 2


def _only_refused(jobs: list[Path], results: list[dict[str, Any] | None]) -> bool:
    """Every job refused its settings before writing anything but its result (and Hydra's own files)."""
    def written(job: Path) -> list[Path]:
        return [path for path in job.rglob("*") if path.is_file() and HYDRA_DIR not in path.relative_to(job).parts
                and path.suffix != ".log" and path.name != "result.json"]

    return bool(jobs) and all(result is not None and result["status"] == REFUSED and not written(job)
                              for job, result in zip(jobs, results))


def end_sweep(sweep_dir: Path, task_name: str, log_dir: str | None) -> int:
    """Print the sweep's summary and return its exit status (:func:`exit_status`). A sweep whose
    every job was refused (each said why in its line) leaves no folder and prints no summary; in a
    folder that holds other files too, only its jobs' folders and ``multirun.yaml`` go."""
    jobs = jobs_of(sweep_dir)
    results = [RunFolder(job).result() for job in jobs]
    if _only_refused(jobs, results):
        if {entry.name for entry in sweep_dir.iterdir()} - {job.name for job in jobs} - {"multirun.yaml"}:
            for job in jobs:  # a folder of the user's (hydra.sweep.dir=THEIRS): only what the sweep wrote goes
                shutil.rmtree(job)
            (sweep_dir / "multirun.yaml").unlink(missing_ok=True)
            return exit_status(results)
        shutil.rmtree(sweep_dir)
        folder, top = sweep_dir.parent, Path(log_dir).absolute() if log_dir else None
        while top is not None and top in folder.parents and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent
        return exit_status(results)
    print(summary(sweep_dir, task_name), flush=True)
    status = exit_status(results)
    if status:
        ended = [f"job {job.name} {result['status'] if result else 'did not finish'}"
                 for job, result in zip(jobs, results) if result is None or result["status"] != FINISHED]
        print(f"sweep: {len(ended)} of {len(jobs)} jobs did not finish ({', '.join(ended)})",
              file=sys.stderr, flush=True)
    return status


class SweepSummary(Callback):
    """Hydra callback: when every job of a sweep has run, print :func:`summary` and end the
    command with the sweep's exit status (non-zero when a job did not finish)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir).absolute()
        if sweep_dir.is_dir():
            status = end_sweep(sweep_dir, config.get("task_name", ""), config.get("paths", {}).get("log_dir"))
            if status:
                raise SystemExit(status)
