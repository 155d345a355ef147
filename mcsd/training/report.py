"""The end of an ``mcsd-train`` run: the closing lines it prints (the result on
each held-out split, which documents it is, and where every artefact is)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger

from mcsd.runtime import sync_command
from mcsd.training.callbacks import SaveFinalModel
from mcsd.training.dashboard import offline_run_folders


def end_of_run_report(trainer: L.Trainer, loggers: list[Logger], callbacks: list[L.Callback], val_loss: float,
            val_ppl: float, tokens: int, train_loss: torch.Tensor | None = None,
            test: tuple[float, float] | None = None, data: dict[str, Any] | None = None,
            log_dir: Path | None = None) -> str:
    """The closing lines: the result on each held-out split (which documents it is) and where every
    artefact is; an offline W&B run's sync command names its folders under ``log_dir`` from earlier
    lives of the run (resumed in other run directories) too."""
    data = data or {}

    def split(name: str) -> str:
        documents, held_out = data.get(f"data/{name}_documents"), data.get(f"data/{name}_held_out")
        if documents is None:
            return f"{name} split"
        return f"{name} split ({documents:,} documents {'held out of training' if held_out else 'of its own'})"

    lines = [f"final validation perplexity: {val_ppl:.2f} (loss {val_loss:.4f}) after {tokens:,} tokens, on the "
             f"{split('val')}"]
    if test is not None:
        lines.append(f"final test perplexity: {test[1]:.2f} (loss {test[0]:.4f}), on the {split('test')}")
        ratio = test[1] / val_ppl if val_ppl > 0 and math.isfinite(val_ppl) and math.isfinite(test[1]) else 1.0
        if not 0.5 <= ratio <= 2:
            counts = [data.get(f"data/{name}_documents") for name in ("val", "test")]
            few = (f"the validation and test splits are {counts[0]:,} and {counts[1]:,} whole documents, so each reads "
                   "what its few documents are like" if None not in counts else "the two splits hold other documents")
            lines.append(f"(test perplexity is {ratio:.1f}x validation: {few}; data.val_documents / "
                         "data.test_documents hold out more; docs/training.md reads the main job's)")
    if trainer.overfit_batches and train_loss is not None:
        lines.append(f"final training loss: {float(train_loss):.4f} on the "
                     f"{trainer.overfit_batches} batches this run overfits (it should fall to about 0); the "
                     "validation perplexity above is on held-out text that an overfitting run does not learn: "
                     "high by design")
    accuracy = getattr(getattr(trainer, "datamodule", None), "accuracy_metric", None)
    for name in (f"val/{accuracy}", f"test/{accuracy}") if accuracy else ():
        if name in trainer.callback_metrics:
            lines.append(f"final {name}: {float(trainer.callback_metrics[name]):.4f}")
    past = [(name, value) for name, value in trainer.callback_metrics.items()
            if accuracy and name.startswith(f"test/{accuracy}_at_")]
    lines += [f"final {name}: {float(value):.4f} (past the training length)"  # by length: _512 before _1024
              for name, value in sorted(past, key=lambda item: int(item[0].rsplit("_", 1)[1]))]
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            run = logger.experiment
            run_dir = Path(run.dir).parent.resolve()
            folders = offline_run_folders(run.id, log_dir.resolve()) if log_dir is not None else []
            folders = folders if run_dir in folders else [*folders, run_dir]
            where = f"{run_dir} (offline; upload with `{sync_command(folders)}`)" if run.settings._offline else run.url
            lines.append(f"W&B run {run.id}: {where}")
        if isinstance(logger, CSVLogger):
            lines.append(f"CSV metrics: {Path(logger.log_dir) / 'metrics.csv'}")
    if trainer.checkpoint_callback is not None and trainer.checkpoint_callback.last_model_path:
        lines.append(f"checkpoint: {trainer.checkpoint_callback.last_model_path}")
    for callback in callbacks:
        if isinstance(callback, SaveFinalModel):
            lines.append(f"model: {callback.dirpath} (mcsd-generate ckpt={callback.dirpath} prompt=\"...\")")
    return "\n".join(lines)
