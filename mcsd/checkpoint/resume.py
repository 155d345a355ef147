"""Resuming a run: what a checkpoint remembers of its run, and the config a resumed run uses.

Every checkpoint records the run's Hydra overrides and its W&B run id (:class:`RememberRun`).
``mcsd-train ckpt_path=CKPT`` or ``mcsd-train resume=RUN_DIR`` (that run's latest checkpoint)
composes the run's own overrides again, with the overrides given beside it applied on top,
so that nothing has to be repeated (a config group chosen anew, ``trainer=cpu``, drops the old
run's overrides of what its option sets, ``trainer.devices=2``); an override that would change the shape of any
model parameter is refused in one line. Resumed on another number of processes (a sharded run
on one, ...), the batch per process is scaled to keep the global batch.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra import compose
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from mcsd.checkpoint.lightning_checkpoint import CHECKPOINT_DIR, WANDB_RUN_KEY, read_checkpoint
from mcsd.checkpoint.run_folder import RunFolder
from mcsd.checkpoint.saved_model import WEIGHTS_FILE
from mcsd.data.datamodule import tokens_per_step
from mcsd.errors import MCSDError
from mcsd.models import registry
from mcsd.models.build import build_model, make_config

log = logging.getLogger(__name__)
OVERRIDES_KEY = "mcsd_overrides"
WORLD_SIZE_KEY = "mcsd_world_size"  # the processes the run trained on
RESUME_KEYS = ("ckpt_path", "resume")  # how a run is resumed: never carried into the resumed run
__all__ = ["OVERRIDES_KEY", "WANDB_RUN_KEY", "RememberRun", "resume_config"]


class RememberRun(L.Callback):
    """Store the run's Hydra overrides, its W&B run id and its number of processes in every checkpoint."""

    def __init__(self, overrides: list[str]) -> None:
        self.overrides = list(overrides)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[OVERRIDES_KEY] = self.overrides
        checkpoint[WORLD_SIZE_KEY] = trainer.world_size
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                checkpoint[WANDB_RUN_KEY] = logger.version


def own_checkpoint(run_dir: Path) -> Path | None:
    """The latest checkpoint already in this run's own directory: a SLURM job requeued after a
    preemption or time limit starts again in its run directory and goes on from there."""
    try:
        return latest_checkpoint(run_dir)
    except MCSDError:
        return None


def latest_checkpoint(run_dir: str | Path) -> Path:
    """``checkpoints/last.ckpt`` of a run, else its highest ``step-*.ckpt`` (:class:`RunFolder`)."""
    if not Path(run_dir).expanduser().exists():
        raise MCSDError(f"resume={run_dir} does not exist (looked for {Path(run_dir).expanduser().absolute()}): give "
                        "an mcsd-train run directory, e.g. resume=logs/train/runs/<time>")
    latest = RunFolder(Path(run_dir)).latest_checkpoint()
    if latest is None:
        raise MCSDError(f"resume={run_dir} holds no {CHECKPOINT_DIR}/*.ckpt: give an mcsd-train run directory "
                        "that saved a checkpoint (or ckpt_path=FILE.ckpt)")
    return latest


def _key(override: str) -> str:
    """The key an override sets: ``model`` for ``model=x``, ``a.b`` for ``+a.b=1`` or ``~a.b``."""
    return re.sub(r"^(\+\+|\+|~)", "", override.split("=", 1)[0])


def _run_overrides(ckpt_path: Path, checkpoint: dict[str, Any]) -> list[str]:
    """The overrides the checkpoint's run was composed with: recorded in the checkpoint, or
    (checkpoints written before they were) in the run directory's ``.hydra/overrides.yaml``."""
    if OVERRIDES_KEY in checkpoint:
        return list(checkpoint[OVERRIDES_KEY])
    return RunFolder(ckpt_path.parent.parent).overrides() or []


def _parameter_shapes(model_cfg: Any) -> dict[str, tuple[int, ...]]:
    """The shapes of the parameters of the model ``model_cfg`` describes (built on the meta device)."""
    with torch.device("meta"):
        return {name: tuple(parameter.shape) for name, parameter in build_model(model_cfg).named_parameters()}


def _keys_set_by(group: str, option: str) -> set[str]:
    """The keys that the config file of ``group=option`` sets itself (not through its defaults)."""
    from hydra.core.global_hydra import GlobalHydra

    result = GlobalHydra.instance().config_loader().repository.load_config(f"{group}/{option}")
    if result is None:
        return set()
    package = result.header.get("package")
    prefix = "" if package == "_global_" else f"{package or group.replace('/', '.')}."
    keys, pending = set(), [(prefix, OmegaConf.to_container(result.config))]
    while pending:
        path, node = pending.pop()
        for name, value in node.items():
            keys.add(f"{path}{name}")
            if isinstance(value, dict):
                pending.append((f"{path}{name}.", value))
    return keys


def _replaced_keys(saved: list[str], given: list[str], groups: set[str]) -> set[str]:
    """Keys of the old run's overrides that a config group chosen anew on this command line
    replaces: those that the old or the new option's file sets (``trainer=cpu`` after
    ``trainer=fsdp trainer.devices=2``: the devices; not ``trainer.max_steps``, which neither sets)."""
    old_choices = {_key(override): override.split("=", 1)[1] for override in saved if "=" in override}
    replaced = set()
    for override in given:
        group = _key(override)
        if group in groups and "=" in override:
            replaced |= _keys_set_by(group, override.split("=", 1)[1])
            if group in old_choices:
                replaced |= _keys_set_by(group, old_choices[group])
    return replaced


def _world_size(cfg: DictConfig) -> int | None:
    """The processes a composed config trains on (``None`` where the trainer decides: ``auto``)."""
    devices, nodes = cfg.trainer.get("devices", 1), cfg.trainer.get("num_nodes", 1)
    return devices * nodes if isinstance(devices, int) and isinstance(nodes, int) else None


def _same_global_batch(composed: DictConfig, checkpoint: dict[str, Any], batch_given: bool) -> int | None:
    """The batch per process that keeps the checkpoint's global batch on the new number of
    processes (``None``: unchanged, or ``data.batch_size`` given on this command line), so that a
    run resumed on more or fewer processes goes on exactly."""
    saved, now = checkpoint.get(WORLD_SIZE_KEY), _world_size(composed)
    if batch_given or saved is None or now is None or saved == now:
        return None
    global_batch = composed.data.batch_size * saved
    if global_batch % now:
        raise MCSDError(f"the checkpoint's run trained on {saved} processes with data.batch_size={composed.data.batch_size} "
                        f"({global_batch} sequences a step), which {now} processes cannot share evenly: set "
                        "data.batch_size (per process) yourself, or use a number of processes that divides it")
    log.info("resumed on %d processes instead of %d: data.batch_size=%d per process keeps the global batch of %d",
             now, saved, global_batch // now, global_batch)
    return global_batch // now


def _refuse_finished(cfg: DictConfig, ckpt_path: Path, checkpoint: dict[str, Any], composed: DictConfig) -> None:
    """A checkpoint at or past the steps the resumed config plans has nothing left to train:
    say so, and how to train on, instead of starting a run (and a W&B run) that stops at once."""
    trainer, data = composed.trainer, composed.data
    if data.get("token_budget") is not None:
        processes = _world_size(composed) or checkpoint.get(WORLD_SIZE_KEY) or 1
        per_step = tokens_per_step(data, trainer.get("accumulate_grad_batches") or 1, processes)
        planned, setting = math.ceil(data.token_budget / per_step), f"data.token_budget (now {data.token_budget})"
    else:
        planned, setting = trainer.get("max_steps"), f"trainer.max_steps (now {trainer.get('max_steps')})"
    step = checkpoint.get("global_step", 0)
    if isinstance(planned, int) and planned > 0 and step >= planned:
        how = f"resume={cfg.resume}" if cfg.get("resume") else f"ckpt_path={ckpt_path}"
        raise MCSDError(f"{how}: that run finished (step {step} of {planned}); to train on from it, give a larger "
                        f"{setting} beside {how.split('=')[0]}=")


def _refuse_another_model(cfg: DictConfig, ckpt_path: Path, saved_model: Any, model: DictConfig) -> None:
    """A resumed run keeps its model: another architecture, or overrides that change the shape
    of a parameter, are refused, naming the setting the user typed (``resume=`` or ``ckpt_path=``)."""
    how = f"resume={cfg.resume}" if cfg.get("resume") else f"ckpt_path={ckpt_path}"
    saved_architecture, architecture = (registry.of_config(make_config(node)) for node in (saved_model, model))
    if saved_architecture is not architecture:
        raise MCSDError(f"{how}: that run trained {saved_architecture.label} (model={saved_architecture.name}), and "
                        f"model={architecture.name} asks for {architecture.label}; a resumed run keeps its model: drop "
                        f"model={architecture.name}, or leave out {how.split('=')[0]}= to train {architecture.name} "
                        "from scratch (init_from=... starts it from saved weights that fit)")
    saved_shapes, shapes = _parameter_shapes(saved_model), _parameter_shapes(model)
    for name in [*saved_shapes, *(shapes.keys() - saved_shapes.keys())]:  # the first in model order
        if saved_shapes.get(name) != shapes.get(name):
            def shape(value: tuple[int, ...] | None) -> str:
                return "absent" if value is None else str(value)

            raise MCSDError(f"{how}: the overrides change the model ({name}: {shape(saved_shapes.get(name))} in the "
                            f"checkpoint, {shape(shapes.get(name))} now); a resumed run keeps its model: drop the "
                            "model/size overrides")


def resume_config(cfg: DictConfig) -> DictConfig:
    """The config of the run to resume, with this command's overrides on top (``cfg``
    itself when nothing is resumed). Also makes it the Hydra config of this run, so that
    the choices it logs are the resumed run's. A run whose own directory already holds a
    checkpoint (a requeued SLURM job) goes on from it, in that directory."""
    own = own_checkpoint(Path(HydraConfig.get().runtime.output_dir))
    if own is not None and not cfg.get("resume") and not cfg.get("ckpt_path"):
        log.info("this run's directory already holds %s (a requeued job): going on from it", own)
        with open_dict(cfg):
            cfg.ckpt_path = str(own)
        return cfg
    if cfg.get("resume"):
        ckpt_path = latest_checkpoint(cfg.resume)
    elif cfg.get("ckpt_path"):
        ckpt_path = Path(cfg.ckpt_path).expanduser()
        if not ckpt_path.exists():
            raise MCSDError(f"ckpt_path={cfg.ckpt_path} does not exist: point it at a .ckpt under a run's "
                            "checkpoints/ (or resume=RUN_DIR)")
        if ckpt_path.suffix == ".safetensors" or (ckpt_path / WEIGHTS_FILE).is_file():
            raise MCSDError(f"ckpt_path={cfg.ckpt_path} is a model's weights, not a run's checkpoint: resume a run "
                            "with resume=RUN_DIR (or ckpt_path=RUN_DIR/checkpoints/last.ckpt), or start a new run "
                            f"from these weights with init_from={cfg.ckpt_path}")
    else:
        return cfg
    checkpoint = read_checkpoint(ckpt_path)
    hydra_cfg = HydraConfig.get()
    given = [override for override in hydra_cfg.overrides.task if _key(override) not in RESUME_KEYS]
    saved = [override for override in _run_overrides(ckpt_path, checkpoint) if _key(override) not in RESUME_KEYS]
    replaced = _replaced_keys(saved, given, set(hydra_cfg.runtime.choices))
    merged = {_key(override): override for override in saved
              if not any(_key(override) == key or _key(override).startswith(f"{key}.") for key in replaced)}
    merged.update({_key(override): override for override in given})  # this command's win
    overrides = [*merged.values(), f"ckpt_path={ckpt_path}"]
    composed = compose(config_name=hydra_cfg.job.config_name, overrides=overrides, return_hydra_config=True)
    batch_size = _same_global_batch(composed, checkpoint, "data.batch_size" in {_key(override) for override in given})
    if batch_size is not None:
        overrides.insert(-1, f"data.batch_size={batch_size}")
        composed = compose(config_name=hydra_cfg.job.config_name, overrides=overrides, return_hydra_config=True)
    _refuse_finished(cfg, ckpt_path, checkpoint, composed)
    _refuse_another_model(cfg, ckpt_path, checkpoint["hyper_parameters"]["model"], composed.model)
    with read_write(hydra_cfg), open_dict(hydra_cfg):  # this run's Hydra config, with the resumed choices
        hydra_cfg.runtime.choices = composed.hydra.runtime.choices
        hydra_cfg.overrides.task = overrides
    with open_dict(composed):
        del composed.hydra
    return composed
