"""A run stopped by a signal: Ctrl-C, ``kill``, a SLURM preemption or time limit stop training after
the step under way with a checkpoint of it (:class:`StopOnSignal`); the run then says how it goes
on, and under SLURM puts its job back in the queue (:func:`requeue_slurm_job`), where it resumes
from that checkpoint (:func:`mcsd.checkpoint.resume.own_checkpoint`)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

import lightning as L

from mcsd.checkpoint.lightning_checkpoint import CHECKPOINT_DIR, LAST_CHECKPOINT
from mcsd.training.dashboard import finish_wandb

log = logging.getLogger(__name__)

STOP_SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM", signal.SIGUSR1: "SIGUSR1",
                signal.SIGUSR2: "SIGUSR2"}


class StopOnSignal(L.Callback):
    """Ctrl-C (SIGINT), SIGTERM (``kill``, a SLURM preemption or time limit) and SIGUSR1/SIGUSR2
    (the warning SLURM sends before the time limit with ``--signal``; submitit's is SIGUSR2) stop
    training at the end of the step under way, with a checkpoint of that step (so that resuming
    is exact); a second Ctrl-C stops at once. Every process handles them, and the processes agree
    at the end of each step (a signal to one stops all). ``signum`` is the signal received and
    ``checkpoint`` the file written, ``None`` while uninterrupted."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.checkpoint: Path | None = None
        self._previous_handlers: dict[int, Any] = {}

    def _request(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            if signum == signal.SIGINT == self.signum:
                raise KeyboardInterrupt
            return  # already stopping
        self.signum = signum
        again = " (Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""
        print(f"\nmcsd-train: {STOP_SIGNALS[signum]}: stopping after this step and saving a checkpoint{again}",
              file=sys.stderr, flush=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After Lightning's own handlers (registered after on_fit_start), which would otherwise end
        # the epoch on SIGTERM before any checkpoint is written.
        if threading.current_thread() is threading.main_thread():
            self._previous_handlers = {signum: signal.signal(signum, self._request) for signum in STOP_SIGNALS}

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if not trainer.strategy.reduce_boolean_decision(self.signum is not None, all=False):
            return
        folder = Path(trainer.checkpoint_callback.dirpath if trainer.checkpoint_callback else
                      Path(trainer.default_root_dir) / CHECKPOINT_DIR)
        self.checkpoint = folder / f"step-{trainer.global_step:06d}.ckpt"
        trainer.save_checkpoint(self.checkpoint, weights_only=False)  # the full state: resuming is exact
        trainer.save_checkpoint(folder / LAST_CHECKPOINT, weights_only=False)
        trainer.should_stop = True
        # A signal stops before the run's minimum length too (Lightning would go on to
        # trainer.min_epochs / min_steps, checkpointing every step): the resumed run goes on to it.
        trainer.fit_loop.min_epochs = 0
        trainer.fit_loop.epoch_loop.min_steps = None

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}


def requeue_slurm_job() -> str | None:
    """Put this SLURM job back in the queue (``scontrol requeue``), as Lightning's
    ``SLURMEnvironment(auto_requeue=True)`` does: the job starts again with the same command,
    run directory and all, and resumes from the checkpoint it finds there. Returns the job id,
    or ``None`` outside SLURM or when the requeue failed (said in one line)."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID") and f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    job = job or os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.error("scontrol requeue %s failed: %s", job, error)
        return None
    if result.returncode != 0:
        log.error("scontrol requeue %s failed: %s", job, result.stderr.strip())
        return None
    return job


def stop_after_signal(trainer: L.Trainer, interrupt: StopOnSignal, run_dir: Path, parallel_jobs: int) -> NoReturn:
    """End a run that a signal stopped: one line naming its checkpoint and how it goes on, exit
    status 128 + the signal. Under SLURM, a run stopped by anything but Ctrl-C puts its job back
    in the queue, and the job goes on from that checkpoint when it starts again. ``parallel_jobs``:
    how many jobs of a sweep run side by side (a worker of several ends with its job)."""
    finish_wandb(128 + interrupt.signum, {"status": "interrupted", "interrupted_at_step": trainer.global_step})
    if trainer.is_global_zero:
        signal_name = STOP_SIGNALS[interrupt.signum]
        job = requeue_slurm_job() if signal_name != "Ctrl-C" else None
        then = (f"SLURM job {job} requeued: it goes on from this checkpoint when it starts again" if job else
                f"resume with `mcsd-train resume={run_dir}`")
        print(f"mcsd-train: interrupted at step {trainer.global_step}: checkpoint {interrupt.checkpoint}; {then} "
              f"({signal_name}; the final model folder is written only for a finished run)", file=sys.stderr, flush=True)
    if parallel_jobs > 1:  # a job of a sweep run side by side: its worker ends too, instead of taking the next job
        for logger in trainer.loggers:
            logger.save()
        sys.stdout.flush()
        os._exit(128 + interrupt.signum)
    raise SystemExit(128 + interrupt.signum)
