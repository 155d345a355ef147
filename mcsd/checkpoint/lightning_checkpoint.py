"""A run's Lightning checkpoints: where a run keeps them and how they are read (a file, or a
sharded folder's metadata), whatever the strategy that wrote them. Their writer, which needs
Lightning, is :mod:`mcsd.checkpoint.lightning_writer`: reading one imports no trainer."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from mcsd.checkpoint.sharded import SHARDED_METADATA, check_sharded_checkpoint
from mcsd.errors import MCSDError
from mcsd.files import require_readable

CHECKPOINT_DIR = "checkpoints"  # a run's checkpoints folder
LAST_CHECKPOINT = "last.ckpt"
WANDB_RUN_KEY = "wandb_run_id"  # the W&B run a checkpoint's training logged to (mcsd.checkpoint.resume.RememberRun)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A run's Lightning checkpoint, memory-mapped (weights are read only when used); a file
    that is not one (truncated, corrupt) is named in one line. Of a sharded checkpoint folder,
    everything but the tensors (whose files are checked to be whole)."""
    path = Path(path)
    if path.is_dir():
        check_sharded_checkpoint(path)
        path = path / SHARDED_METADATA
    require_readable(path)
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile):
        others = sorted(other for other in path.parent.glob("step-*.ckpt") if other != path)
        beside = (f": the newest other one beside it is {others[-1]} (ckpt_path={others[-1]})" if others else
                  ": use another checkpoint of the run")
        raise MCSDError(f"{path} is not a readable checkpoint (truncated or corrupt){beside}") from None
