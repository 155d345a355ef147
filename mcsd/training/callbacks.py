"""Callbacks of ours: the final model as safetensors, and the W&B run to resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

import mcsd

WANDB_RUN_KEY = "wandb_run_id"


def batch_size(batch: dict[str, torch.Tensor]) -> int:
    """Sequences in a batch (for Lightning's ThroughputMonitor)."""
    return batch["input_ids"].shape[0]


def batch_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Predicted tokens in a batch (the monitor's items: its items_per_sec is tokens/s)."""
    ids = batch["input_ids"]
    return ids.shape[0] * (ids.shape[1] - 1)


class SaveFinalModel(L.Callback):
    """At the end of training write ``model.safetensors``, ``config.json`` and the
    tokenizer to ``dirpath``, the folder that ``mcsd.load`` and ``mcsd-generate`` read."""

    def __init__(self, dirpath: str) -> None:
        self.dirpath = Path(dirpath)

    @rank_zero_only
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        mcsd.save(pl_module.model, self.dirpath)
        tokenizer = getattr(trainer.datamodule, "tokenizer", None)
        if tokenizer is not None:
            tokenizer.save(str(self.dirpath / "tokenizer.json"))


class RememberWandbRun(L.Callback):
    """Store the W&B run id in every checkpoint, so that resuming continues the same run."""

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                checkpoint[WANDB_RUN_KEY] = logger.version


def wandb_run_of(ckpt_path: str) -> str | None:
    """The W&B run id stored in a checkpoint by :class:`RememberWandbRun` (memory-mapped read)."""
    checkpoint = torch.load(ckpt_path, map_location="cpu", mmap=True, weights_only=False)
    return checkpoint.get(WANDB_RUN_KEY)
