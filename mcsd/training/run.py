"""What ``mcsd-train`` runs: data, model, loggers, callbacks and trainer built from a composed
config, the run fitted, validated, tested, reported and its model saved. Apart from the command
(:mod:`mcsd.commands.train`) so that the command imports Lightning only in a process that trains:
a sweep's launching process, ``--help``, ``--cfg`` and a refused setting answer without it."""


from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import Logger, WandbLogger
from omegaconf import DictConfig, OmegaConf, open_dict
from tokenizers import Tokenizer

from mcsd.checkpoint.lightning_checkpoint import read_checkpoint
from mcsd.checkpoint.resume import WANDB_RUN_KEY, RememberRun, resume_config
from mcsd.checkpoint.run_folder import DIVERGED, FINISHED, write_result
from mcsd.checkpoint.saved_model import load_tokenizer
from mcsd.runtime import parallel_jobs, require_wandb_login
from mcsd.data.datamodule import tokens_per_step as data_tokens_per_step
from mcsd.data.tokenizer import load_tokenizer as load_tokenizer_file
from mcsd.errors import MCSDError
from mcsd.models.build import build_model, make_config
from mcsd.models.modeling import CausalLM
from mcsd.precision import Precision, mixed_precision_dtype
from mcsd.training.callbacks import DivergedError, SaveFinalModel, StopOnDivergence
from mcsd.training.checks import check_run
from mcsd.training.dashboard import (BestValidation, RememberIdentity, RunIdentity, exit_code_of, finish_wandb,
                                     run_identity, wandb_arguments)
from mcsd.training.fsdp import FSDP2Strategy
from mcsd.training.loggers import WandbLogger as TokenCountingWandbLogger
from mcsd.training.memory import MemoryPlan, check_fits, peak_resident_bytes, plan_memory
from mcsd.training.module import LanguageModelModule
from mcsd.training.report import end_of_run_report
from mcsd.training.signals import StopOnSignal, stop_after_signal

log = logging.getLogger("mcsd.training.run")
CHOICE_GROUPS = ("model", "size", "ablation", "variant", "data", "task", "trainer", "logger", "experiment", "debug")


def _typed_settings() -> set[str]:
    """The keys this command's own overrides set (``+``/``~`` dropped)."""
    return {override.split("=", 1)[0].lstrip("+~") for override in HydraConfig.get().overrides.task}


def _length_as_typed(cfg: DictConfig) -> None:
    """``trainer.max_steps`` typed on the command line wins over a token budget that a config
    (an experiment, a data option) sets; both typed is refused, naming them."""
    budget = cfg.data.get("token_budget")
    typed = _typed_settings()
    if budget is None or "trainer.max_steps" not in typed:
        return
    if "data.token_budget" in typed:
        raise MCSDError(f"trainer.max_steps={cfg.trainer.max_steps} and data.token_budget={budget} both set the run's "
                        "length: give one of them")
    with open_dict(cfg):
        cfg.data.token_budget = None
    log.info("trainer.max_steps=%s as typed, instead of the %s-token budget data.token_budget that the config sets",
             cfg.trainer.max_steps, f"{budget:,}")


def _hold_out_only_what_is_run(cfg: DictConfig) -> None:
    """A corpus that names its own validation files and no test files, in a run that tests
    nothing (``test_after_training=false``), keeps every training document: no test documents
    are held out of them."""
    paths = OmegaConf.select(cfg, "data.paths", default=None)
    if (not cfg.test_after_training and isinstance(paths, DictConfig) and "val" in paths and "test" not in paths
            and "test_fraction" in cfg.data):
        with open_dict(cfg):
            cfg.data.test_fraction, cfg.data.test_documents = 0.0, None
        log.info("data.paths names val files and test_after_training=false: no test documents held out of training")


def _tokenizer_of_weights(cfg: DictConfig) -> Tokenizer | None:
    """The tokenizer of the weights a run starts from (``init_from``'s, or the resumed
    checkpoint's), which then tokenizes the corpus: embeddings learnt under one tokenizer mean
    nothing under another. A ``data.tokenizer_path`` that is another tokenizer is refused; weights
    saved without a tokenizer leave the choice to ``data.tokenizer_path`` (or a new BPE), said so."""
    key = "ckpt_path" if cfg.ckpt_path else "init_from" if cfg.init_from else None
    if key is None or "tokenizer_path" not in cfg.data:  # MQAR's data has no tokenizer
        return None
    try:
        tokenizer = load_tokenizer(cfg[key])
    except FileNotFoundError as error:
        log.warning("%s=%s: %s; the corpus is tokenized as a run from scratch would", key, cfg[key], error)
        return None
    if cfg.data.tokenizer_path and load_tokenizer_file(cfg.data.tokenizer_path).to_str() != tokenizer.to_str():
        raise MCSDError(f"data.tokenizer_path={cfg.data.tokenizer_path} is not the tokenizer of {key}={cfg[key]}, "
                        "whose weights the run starts from: drop data.tokenizer_path (the run uses the weights' own)")
    log.info("%s=%s: the corpus is tokenized with its tokenizer (%d tokens)", key, cfg[key], tokenizer.get_vocab_size())
    return tokenizer


def _memory_plan(cfg: DictConfig, meta_model: CausalLM) -> MemoryPlan:
    """This process's memory plan for the composed run (:mod:`mcsd.training.memory`)."""
    trainer = cfg.trainer
    gpu = trainer.accelerator in ("gpu", "cuda") or (trainer.accelerator == "auto" and torch.cuda.is_available())
    devices = trainer.devices if isinstance(trainer.devices, int) else (torch.cuda.device_count() if gpu else 1)
    sharded = "FSDP2Strategy" in str(OmegaConf.select(cfg, "trainer.strategy._target_", default=""))
    mixed = OmegaConf.select(cfg, "trainer.strategy.mixed_precision", default="fp32")
    trained, sharded_dtype = Precision.of_trainer(trainer.precision).compute, mixed_precision_dtype(mixed, "cuda" if gpu else "cpu")
    compute = torch.bfloat16 if torch.bfloat16 in (trained, sharded_dtype) else trained
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    return plan_memory(meta_model, cfg.data.batch_size, cfg.data.seq_len, devices * trainer.get("num_nodes", 1), devices,
                       sharded, compute, f"cuda:{local_rank}" if gpu else "cpu")


def _record_peak(plan: MemoryPlan, trainer: L.Trainer) -> None:
    """Each process writes its plan and its measured peak to ``memory/process-<rank>.json`` in the run directory."""
    gpu = trainer.strategy.root_device.type == "cuda"
    peak = torch.cuda.max_memory_allocated(trainer.strategy.root_device) if gpu else peak_resident_bytes()
    folder = Path(HydraConfig.get().runtime.output_dir) / "memory"
    folder.mkdir(parents=True, exist_ok=True)
    record = {**dataclasses.asdict(plan), "planned": plan.total, "peak": peak, "measured": "max_memory_allocated" if gpu
              else "VmHWM"}
    (folder / f"process-{trainer.global_rank}.json").write_text(json.dumps(record, indent=2) + "\n")
    log.info("memory: peak %.2f GiB, planned %.2f GiB (process %d)", peak / 2**30, plan.total / 2**30,
             trainer.global_rank)


def _loggers(cfg: DictConfig, identity: RunIdentity, run_id: str | None) -> list[Logger]:
    """The configured loggers; a W&B one with the run's identity (group, name, tags) and, resuming, its run id."""
    loggers = []
    for name, node in (cfg.get("logger") or {}).items():
        if node is None:
            continue
        if "_target_" not in node:
            raise MCSDError(f"logger.{name} has no _target_: give it one or remove it (logger=none for no logging)")
        extra = {}
        if "Wandb" in node._target_:
            if not node.get("offline", False):
                require_wandb_login(f"logger.{name}")
            extra = {**wandb_arguments(node, identity), **({"id": run_id, "resume": "allow"} if run_id else {})}
        loggers.append(instantiate(node, **extra))
    return loggers


def _choices() -> dict[str, Any]:
    choices = HydraConfig.get().runtime.choices
    return {group: choices.get(group) for group in CHOICE_GROUPS}


def train(cfg: DictConfig) -> float:
    """Build data, model, loggers, callbacks and trainer from ``cfg``; fit; return val/loss."""
    _length_as_typed(cfg)
    # The model resolved once (equal-size widths) and built once on the meta device: the checks,
    # the memory plan and the module share them.
    model_config = make_config(cfg.model)
    meta_model = build_model(model_config, device="meta")
    check_run(cfg, meta_model)
    plan = _memory_plan(cfg, meta_model)  # before anything is allocated
    log.info(plan.line())
    L.seed_everything(cfg.seed, workers=True)
    _hold_out_only_what_is_run(cfg)
    tokenizer = _tokenizer_of_weights(cfg)
    datamodule = instantiate(cfg.data, **({"tokenizer": tokenizer} if tokenizer is not None else {}))
    datamodule.build()  # fails fast (one line) on bad data, before any logger starts
    check_fits(plan, "this run")  # after the data: a seq_len longer than the corpus is the data's problem, not memory's
    resumed = read_checkpoint(cfg.ckpt_path) if cfg.ckpt_path else None
    identity = run_identity(cfg, model_config, resumed)
    loggers = _loggers(cfg, identity, resumed.get(WANDB_RUN_KEY) if resumed else None)
    callbacks = [instantiate(node) for node in (cfg.get("callbacks") or {}).values() if node is not None]
    interrupt = StopOnSignal()
    callbacks += [RememberRun(HydraConfig.get().overrides.task), RememberIdentity(identity), BestValidation(),
                  interrupt, StopOnDivergence(OmegaConf.select(cfg, "optimizer.lr", default=None))]
    if not loggers:  # nothing to report learning rates to (Lightning refuses the monitor then)
        callbacks = [callback for callback in callbacks if not isinstance(callback, LearningRateMonitor)]
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    # A resumed run restores its own weights; a sharded one builds its model on the meta device.
    module = LanguageModelModule(model=model_config, optimizer=instantiate(cfg.optimizer),
                                 scheduler=instantiate(cfg.scheduler), compile=cfg.compile, trainable=cfg.trainable,
                                 init_from=cfg.init_from if cfg.ckpt_path is None else None,
                                 empty_init=isinstance(trainer.strategy, FSDP2Strategy),
                                 compression_length=getattr(datamodule, "compression_length", None))
    if cfg.init_from is not None and cfg.ckpt_path is None:
        log.info("init_from=%s: weights loaded", cfg.init_from)
    tokens_per_step = data_tokens_per_step(cfg.data, trainer.accumulate_grad_batches, trainer.world_size)
    if cfg.data.token_budget is not None:
        trainer.fit_loop.epoch_loop.max_steps = math.ceil(cfg.data.token_budget / tokens_per_step)
        log.info("data.token_budget=%d: %d steps of %d tokens", cfg.data.token_budget, trainer.max_steps,
                 tokens_per_step)

    for logger in loggers:
        if isinstance(logger, WandbLogger):
            logger.experiment.define_metric("*", step_metric="trainer/tokens", step_sync=True)
            if isinstance(logger, TokenCountingWandbLogger):
                logger.tokens = lambda: float(module.tokens_seen)
        logger.log_hyperparams({
            **OmegaConf.to_container(cfg, resolve=True),
            "choices": _choices(),
            **identity.config,
            **module.describe(),
            **datamodule.describe(),
            "trainer/tokens_per_step": tokens_per_step,
        })

    if cfg.validate_before_training and cfg.ckpt_path is None:
        trainer.validate(module, datamodule=datamodule, verbose=False)
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
    except DivergedError as error:
        if trainer.is_global_zero:  # a sweep's summary says which job diverged, and where
            write_result(Path(HydraConfig.get().runtime.output_dir), {
                "status": DIVERGED, "reason": str(error), "diverged_at_step": error.step, "val_loss": None,
                "val_ppl": None, "test_loss": None, "test_ppl": None, "tokens": int(module.tokens_seen),
                "steps": trainer.global_step})
        finish_wandb(2, {"status": DIVERGED, "diverged_at_step": error.step})
        raise
    if interrupt.checkpoint is not None:
        stop_after_signal(trainer, interrupt, Path(HydraConfig.get().runtime.output_dir), parallel_jobs())
    train_loss = trainer.callback_metrics.get("train/loss")  # a validation below keeps only its own metrics
    if module.validated_at_step != trainer.global_step:  # the final model is always validated
        trainer.validate(module, datamodule=datamodule, verbose=False)
    _record_peak(plan, trainer)
    val_loss = float(trainer.callback_metrics.get("val/loss", float("nan")))
    val_ppl = float(trainer.callback_metrics.get("val/ppl", float("nan")))
    test = None
    if cfg.test_after_training:
        trainer.test(module, datamodule=datamodule, verbose=False)
        test = (float(trainer.callback_metrics.get("test/loss", float("nan"))),
                float(trainer.callback_metrics.get("test/ppl", float("nan"))))
    report = end_of_run_report(trainer, loggers, callbacks, val_loss, val_ppl, int(module.tokens_seen), train_loss, test,
                               datamodule.describe(), Path(cfg.paths.log_dir).absolute())
    if trainer.is_global_zero:  # what a sweep's summary reads (mcsd.training.sweep)
        write_result(Path(HydraConfig.get().runtime.output_dir), {
            "status": FINISHED, "val_loss": val_loss, "val_ppl": val_ppl, "test_loss": test[0] if test else None,
            "test_ppl": test[1] if test else None, "tokens": int(module.tokens_seen), "steps": trainer.global_step})
    final_model = next((callback for callback in callbacks if isinstance(callback, SaveFinalModel)), None)
    for logger in loggers:
        if isinstance(logger, TokenCountingWandbLogger) and final_model is not None and trainer.is_global_zero:
            logger.log_model_folder(final_model.dirpath, {**module.describe(), **identity.config, "val/ppl": val_ppl,
                                                          "tokens": int(module.tokens_seen)})
    finish_wandb(0, {"status": FINISHED, **({"test/ppl": test[1]} if test else {})})  # before the report: it prints last
    if trainer.is_global_zero:
        print(report, flush=True)
    return val_loss


def run(cfg: DictConfig) -> float:
    """``mcsd-train``'s job: the run ``cfg`` describes, or the one its checkpoint (``resume=``)
    goes on with, trained; its W&B run ends as the process does (a sweep's jobs must not share one)."""
    try:
        return train(resume_config(cfg))
    except BaseException as error:
        finish_wandb(exit_code_of(error))
        raise
