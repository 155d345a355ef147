"""Loggers of ours: Lightning's W&B logger without the argument W&B warns about, and its CSV
logger appending to the log of a run that goes on in its own directory."""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from mcsd.errors import MCSDError


# Rows the dashboard leaves to the CSV: ThroughputMonitor's running counters (its rates stay) and
# its validation rows (logged at the validation loop's own batch count, not the trainer's step).
COUNTERS = re.compile(r"^(validate/.*|(train|test)/(device/)?(time|batches|samples|lengths))$")
LEARNING_RATE = re.compile(r"^(lr-\w+)/pg(\d+)$")


class WandbLogger(LightningWandbLogger):
    """Lightning's ``WandbLogger``, minus ``anonymous`` (Lightning always passes it to ``wandb.init``,
    as ``None``, and W&B warns on every run that the setting has no effect), with every row at its
    own token count and without the rows that clutter a dashboard.

    ``tokens``: the run's tokens so far (set by ``mcsd-train``); a row that does not log
    ``trainer/tokens`` itself (the learning rate's, at a step's start; the throughput's, at its end)
    gets it from there, where W&B's ``step_sync`` would carry the last logged one (a logging
    interval behind). Left out: :data:`COUNTERS`, and a parameter group's learning rate equal to
    the first group's (``lr-AdamW/pg2``: weight decay is a group's only difference).

    ``log_model``: the run's final model folder as an artifact (:meth:`log_model_folder`), online
    and offline; Lightning's own ``log_model`` (checkpoints, refused offline) is not used.

    ``offline`` reaches ``wandb.init`` as its ``mode``: Lightning says it through ``WANDB_MODE``
    alone, which W&B reads once per process, so a process whose W&B was set up online before (a
    notebook that logged in, an earlier job of a sweep run in one process) would log in instead."""

    def __init__(self, *args: Any, log_model: bool = True, **kwargs: Any) -> None:
        if not isinstance(log_model, bool):
            raise MCSDError(f"logger.wandb.log_model={log_model!r} must be true (the final model folder as a W&B artifact "
                            "of type model, offline too) or false (none); every checkpoint as an artifact is not offered")
        super().__init__(*args, log_model=False, **kwargs)  # Lightning's own (checkpoints, online only): never
        self._wandb_init.pop("anonymous", None)
        if self._offline:
            self._wandb_init["mode"] = "offline"
        self.tokens: Callable[[], float] | None = None
        self.model_artifact = log_model

    def log_model_folder(self, folder: Path, metadata: Mapping[str, Any]) -> None:
        """The run's final model folder as an artifact of type ``model`` (``model-<run id>``, alias
        ``final``), with ``metadata``; offline, W&B stages a copy until ``wandb sync`` uploads it."""
        if not self.model_artifact or not Path(folder).is_dir():
            return
        import wandb

        artifact = wandb.Artifact(f"model-{self.experiment.id}", type="model", metadata=dict(metadata))
        artifact.add_dir(str(folder))
        self.experiment.log_artifact(artifact, aliases=["final"])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        rows = {name: value for name, value in metrics.items() if not COUNTERS.match(name)
                and not self._repeated_learning_rate(name, value, metrics)}
        if not rows:
            return
        if self.tokens is not None and "trainer/tokens" not in rows:
            rows["trainer/tokens"] = self.tokens()
        super().log_metrics(rows, step)

    @staticmethod
    def _repeated_learning_rate(name: str, value: float, metrics: Mapping[str, float]) -> bool:
        match = LEARNING_RATE.match(name)
        return bool(match) and match.group(2) != "1" and metrics.get(f"{match.group(1)}/pg1") == value


class AppendingExperimentWriter(ExperimentWriter):
    """Lightning's CSV writer, appending to a ``metrics.csv`` already in its folder (a requeued
    SLURM job going on in its own run directory) where Lightning's deletes it."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = next(csv.reader(file), [])


class CSVLogger(LightningCSVLogger):
    """Lightning's ``CSVLogger``, keeping the rows a run's earlier life wrote (see
    :class:`AppendingExperimentWriter`)."""

    @property
    @rank_zero_experiment
    def experiment(self) -> AppendingExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingExperimentWriter(log_dir=self.log_dir)
        return self._experiment
