"""Resuming a run: what a checkpoint remembers of its run, and the config a resumed run uses.

Every checkpoint records the run's Hydra overrides and its W&B run id (:class:`RememberRun`).
``mcsd-train ckpt_path=CKPT`` or ``mcsd-train resume=RUN_DIR`` (that run's latest checkpoint)
composes the run's own overrides again, with the overrides given beside it applied on top,
so that nothing has to be repeated; an override that would change the shape of any model
parameter is refused in one line.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from mcsd.errors import MCSDError
from mcsd.saved_model import CHECKPOINT_DIR, LAST_CHECKPOINT, read_checkpoint

WANDB_RUN_KEY = "wandb_run_id"
OVERRIDES_KEY = "mcsd_overrides"
RESUME_KEYS = ("ckpt_path", "resume")  # how a run is resumed: never carried into the resumed run


class RememberRun(L.Callback):
    """Store the run's Hydra overrides and its W&B run id in every checkpoint."""

    def __init__(self, overrides: list[str]) -> None:
        self.overrides = list(overrides)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[OVERRIDES_KEY] = self.overrides
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                checkpoint[WANDB_RUN_KEY] = logger.version


class StopOnInterrupt(L.Callback):
    """Ctrl-C (SIGINT) stops training at the end of the step under way, with a checkpoint of
    that step (so that resuming is exact); a second Ctrl-C stops at once. ``checkpoint`` is
    the file written, ``None`` while uninterrupted."""

    def __init__(self) -> None:
        self.requested = False
        self.checkpoint: Path | None = None
        self._previous_handler: Any = None

    def _request(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\nmcsd-train: stopping after this step and saving a checkpoint (Ctrl-C again to stop at once)",
              file=sys.stderr, flush=True)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGINT, self._request)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if not trainer.strategy.reduce_boolean_decision(self.requested, all=False):
            return
        folder = Path(trainer.checkpoint_callback.dirpath if trainer.checkpoint_callback else
                      Path(trainer.default_root_dir) / CHECKPOINT_DIR)
        self.checkpoint = folder / f"step-{trainer.global_step:06d}.ckpt"
        trainer.save_checkpoint(self.checkpoint, weights_only=False)  # the full state: resuming is exact
        trainer.save_checkpoint(folder / LAST_CHECKPOINT, weights_only=False)
        trainer.should_stop = True

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGINT, self._previous_handler)
            self._previous_handler = None


def latest_checkpoint(run_dir: str | Path) -> Path:
    """``checkpoints/last.ckpt`` of a run, else its highest ``step-*.ckpt``."""
    folder = Path(run_dir).expanduser() / CHECKPOINT_DIR
    if (folder / LAST_CHECKPOINT).is_file():
        return folder / LAST_CHECKPOINT
    steps = sorted(folder.glob("step-*.ckpt"))
    if not steps:
        raise MCSDError(f"resume={run_dir} holds no {CHECKPOINT_DIR}/*.ckpt: give an mcsd-train run directory "
                        "that saved a checkpoint (or ckpt_path=FILE.ckpt)")
    return steps[-1]


def _key(override: str) -> str:
    """The key an override sets: ``model`` for ``model=x``, ``a.b`` for ``+a.b=1`` or ``~a.b``."""
    return re.sub(r"^(\+\+|\+|~)", "", override.split("=", 1)[0])


def _run_overrides(ckpt_path: Path, checkpoint: dict[str, Any]) -> list[str]:
    """The overrides the checkpoint's run was composed with: recorded in the checkpoint, or
    (checkpoints written before they were) in the run directory's ``.hydra/overrides.yaml``."""
    if OVERRIDES_KEY in checkpoint:
        return list(checkpoint[OVERRIDES_KEY])
    saved = ckpt_path.parent.parent / ".hydra" / "overrides.yaml"
    return list(OmegaConf.load(saved)) if saved.is_file() else []


def _parameter_shapes(model_cfg: Any) -> dict[str, tuple[int, ...]]:
    from mcsd.api import build_model

    with torch.device("meta"):
        return {name: tuple(parameter.shape) for name, parameter in build_model(model_cfg).named_parameters()}


def resume_config(cfg: DictConfig) -> DictConfig:
    """The config of the run to resume, with this command's overrides on top (``cfg``
    itself when nothing is resumed). Also makes it the Hydra config of this run, so that
    the choices it logs are the resumed run's."""
    if cfg.get("resume"):
        ckpt_path = latest_checkpoint(cfg.resume)
    elif cfg.get("ckpt_path"):
        ckpt_path = Path(cfg.ckpt_path).expanduser()
        if not ckpt_path.is_file():
            raise MCSDError(f"ckpt_path={cfg.ckpt_path} does not exist: point it at a .ckpt under a run's "
                            "checkpoints/ (or resume=RUN_DIR)")
    else:
        return cfg
    checkpoint = read_checkpoint(ckpt_path)
    hydra_cfg = HydraConfig.get()
    merged: dict[str, str] = {}
    for override in [*_run_overrides(ckpt_path, checkpoint), *hydra_cfg.overrides.task]:
        if _key(override) not in RESUME_KEYS:
            merged[_key(override)] = override  # later ones (this command's) win
    overrides = [*merged.values(), f"ckpt_path={ckpt_path}"]
    composed = compose(config_name=hydra_cfg.job.config_name, overrides=overrides, return_hydra_config=True)
    saved_shapes, shapes = _parameter_shapes(checkpoint["hyper_parameters"]["model"]), _parameter_shapes(composed.model)
    for name in [*saved_shapes, *(shapes.keys() - saved_shapes.keys())]:  # the first in model order
        if saved_shapes.get(name) != shapes.get(name):
            raise MCSDError(f"ckpt_path={ckpt_path}: the overrides change the model ({name}: "
                            f"{saved_shapes.get(name)} in the checkpoint, {shapes.get(name)} now); a resumed run "
                            "keeps its model: drop the model/size overrides")
    with read_write(hydra_cfg), open_dict(hydra_cfg):  # this run's Hydra config, with the resumed choices
        hydra_cfg.runtime.choices = composed.hydra.runtime.choices
        hydra_cfg.overrides.task = overrides
    with open_dict(composed):
        del composed.hydra
    return composed
