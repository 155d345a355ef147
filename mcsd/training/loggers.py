"""Loggers of ours: Lightning's W&B logger without the argument W&B warns about, and its CSV
logger appending to the log of a run that goes on in its own directory."""

from __future__ import annotations

import csv
from typing import Any

from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment


class WandbLogger(LightningWandbLogger):
    """Lightning's ``WandbLogger``, minus ``anonymous``: Lightning always passes it to
    ``wandb.init`` (as ``None``), and W&B warns on every run that the setting has no effect."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._wandb_init.pop("anonymous", None)


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
