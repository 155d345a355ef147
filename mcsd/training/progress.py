"""Training progress that counts the run, not the epoch: Lightning's tqdm bar over the run's
optimizer steps with the tokens seen, and, when output is not a terminal (a log file, a sweep
job), a plain line now and then instead of a bar that a file would hold as one endless line."""

from __future__ import annotations

import datetime
import sys
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import convert_inf


def _duration(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


class RunProgressBar(TQDMProgressBar):
    """The training bar counts optimizer steps of the whole run (``trainer.max_steps``, or every
    epoch's steps for a run by epochs; a resumed run starts at its step) and shows the tokens
    seen; its description names the epoch. When stdout is not a terminal the bars stay off and a
    line is printed every ``line_every_s`` seconds and after each validation: step of total,
    tokens, tokens/s, time spent and left, the latest losses. ``refresh_rate=0`` turns both off."""

    def __init__(self, refresh_rate: int = 10, line_every_s: float = 60.0, process_position: int = 0) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position)
        self.line_every_s = line_every_s
        self.lines = not sys.stdout.isatty()
        self._start = self._last_line = 0.0
        self._first_step = 0

    @property
    def is_disabled(self) -> bool:
        return super().is_disabled or self.lines

    @property
    def writes_lines(self) -> bool:
        return self.lines and self._enabled and self.refresh_rate > 0 and self.trainer.is_global_zero

    def _total_steps(self, trainer: L.Trainer) -> int | None:
        total = convert_inf(trainer.estimated_stepping_batches)
        return int(total) if total is not None else None

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        tokens = getattr(pl_module, "tokens_seen", None)
        if tokens is not None:
            metrics["tokens"] = f"{int(tokens):,}"
        return metrics

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        bar = self.train_progress_bar
        bar.reset(total=self._total_steps(trainer))
        bar.initial = trainer.global_step
        bar.n = trainer.global_step
        self._start = self._last_line = time.monotonic()
        self._first_step = trainer.global_step

    def on_train_epoch_start(self, trainer: L.Trainer, *_: Any) -> None:
        self.train_progress_bar.set_description(f"Epoch {trainer.current_epoch}")  # the run's bar goes on

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step, bar = trainer.global_step, self.train_progress_bar
        if self._should_update(step, bar.total):
            bar.n = step
            bar.refresh()
            bar.set_postfix(self.get_metrics(trainer, pl_module))
        if self.writes_lines and time.monotonic() - self._last_line >= self.line_every_s:
            self._line(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if self.writes_lines and not trainer.sanity_checking and trainer.state.fn == "fit":
            self._line(trainer, pl_module)

    def _line(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        now, step, total = time.monotonic(), trainer.global_step, self._total_steps(trainer)
        self._last_line = now
        elapsed, done = now - self._start, step - self._first_step
        parts = [f"step {step:,}" + (f"/{total:,} ({100 * step / total:.0f}%)" if total else "")]
        tokens = getattr(pl_module, "tokens_seen", None)
        if tokens is not None:
            parts.append(f"{int(tokens):,} tokens")
            run_tokens = int(tokens) * done / step if step else 0
            if elapsed > 0 and run_tokens:
                parts.append(f"{run_tokens / elapsed:,.0f} tokens/s")
        parts.append(f"{_duration(elapsed)} spent")
        if total and done and step < total:
            parts.append(f"~{_duration(elapsed / done * (total - step))} left")
        metrics = trainer.callback_metrics
        parts += [f"{name} {float(metrics[name]):.4f}" for name in ("train/loss", "val/loss") if name in metrics]
        print(f"Epoch {trainer.current_epoch}: " + ", ".join(parts), file=sys.stdout, flush=True)
