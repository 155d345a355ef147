"""The end of a sweep (``mcsd-train -m ...``): one summary instead of its last job's lines.

Each finished run writes ``result.json`` (its final validation and test loss and perplexity)
into its folder; when Hydra has run every job, :class:`SweepSummary` prints the sweep's folder,
a line per job (what the job overrode that the others did not, and its result) and the command
that draws the sweep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from mcsd.checkpoint.run_folder import RunFolder


def summary(sweep_dir: Path, task_name: str) -> str:
    """The sweep's folder, each job's own overrides and result, and the plot command."""
    jobs = sorted((path for path in sweep_dir.iterdir() if path.is_dir() and path.name.isdigit()), key=lambda p: int(p.name))
    overrides = {job: RunFolder(job).overrides() or [] for job in jobs}
    shared = set.intersection(*(set(values) for values in overrides.values())) if overrides else set()
    lines = [f"sweep: {sweep_dir} ({len(jobs)} job{'s' if len(jobs) != 1 else ''})"]
    for job in jobs:
        own = " ".join(value for value in overrides[job] if value not in shared) or "(the sweep's settings)"
        result = RunFolder(job).result()
        if result is not None:
            if result.get("diverged_at_step") is not None:
                text = f"diverged at step {result['diverged_at_step']} (no result)"
            else:
                text = "val ppl " + ("not finite" if result.get("val_ppl") is None else f"{result['val_ppl']:.2f}")
                if result.get("test_ppl") is not None:
                    text += f", test ppl {result['test_ppl']:.2f}"
        else:
            text = "no result (it did not finish)"
        lines.append(f"  job {job.name}: {own}: {text}")
    if task_name == "train":
        lines.append(f"plot: mcsd-plot ablation {sweep_dir} (or mcsd-plot scaling {sweep_dir} for a sweep of sizes)")
    return "\n".join(lines)


class SweepSummary(Callback):
    """Hydra callback: print :func:`summary` when every job of a sweep has run."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir).absolute()
        if sweep_dir.is_dir():
            print(summary(sweep_dir, config.get("task_name", "")), flush=True)
