"""A run's Lightning checkpoints written whole or not at all (Lightning's checkpoint IO plugin,
``trainer.plugins``), and loaded whole from a sharded folder. Apart from the reader
(:mod:`mcsd.checkpoint.lightning_checkpoint`) so that reading a checkpoint imports no Lightning."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from mcsd.checkpoint.lightning_checkpoint import LAST_CHECKPOINT
from mcsd.checkpoint.sharded import is_sharded_checkpoint, whole_checkpoint
from mcsd.errors import MCSDError


def disk_is_full(error: BaseException, folder: Path) -> bool:
    """Whether a failed write failed for want of space: ``ENOSPC``, or torch's zip writer's short
    write (``unexpected pos``, a RuntimeError) on a disk that has (almost) nothing left."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return "unexpected pos" in str(error) and shutil.disk_usage(folder).free < 64 * 2**20
    except OSError:
        return False


def mount_point(folder: Path) -> str:
    """The file system that holds ``folder``, as its mount point (``/`` at most)."""
    path = folder.resolve()
    device = path.stat().st_dev
    while path.parent != path and path.parent.stat().st_dev == device:
        path = path.parent
    return str(path)


def last_whole(folder: Path) -> str:
    """Which checkpoint of ``folder`` a run resumes from after a failed write."""
    last = folder / LAST_CHECKPOINT
    return (f"{last} is the last whole checkpoint" if last.exists() else
            f"{folder} holds no whole checkpoint yet")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write each checkpoint to a temporary file in its own folder, flush it to disk, then
    rename it into place (``os.replace`` is atomic within a folder): a write that fails (a
    full disk) or is killed leaves the previous checkpoint of that name whole (a killed write
    leaves its hidden temporary file, removed by the next write of that name; a full disk ends the
    run in one line naming the file system and the last whole checkpoint). Lightning's
    own writer stages the file in the system's temporary folder and moves it, which across
    filesystems is a copy into place. (Sharded checkpoints are written by
    :class:`mcsd.training.fsdp.FSDP2Strategy`, atomically too.)"""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if "://" in str(path):  # remote storage: Lightning's writer
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(temporary, "wb") as handle:
                torch.save(checkpoint, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, path)
        except (OSError, RuntimeError) as error:
            written = temporary.stat().st_size if temporary.exists() else 0
            temporary.unlink(missing_ok=True)
            if disk_is_full(error, path.parent):
                raise MCSDError(f"no space left on {mount_point(path.parent)} (writing {path}, {written / 2**20:.0f} MiB "
                                f"written): the checkpoint was not saved; {last_whole(path.parent)}; free some space "
                                f"and resume with `mcsd-train resume={path.parent.parent}`") from None
            raise
        finally:
            temporary.unlink(missing_ok=True)
        for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a process that was killed mid-write
            stale.unlink(missing_ok=True)

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None
                        ) -> dict[str, Any]:
        """A checkpoint file, or a sharded checkpoint folder (``trainer=fsdp``) assembled whole, so
        that a sharded run resumes on one process or under DDP."""
        if is_sharded_checkpoint(Path(path)):
            return whole_checkpoint(Path(path))
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
