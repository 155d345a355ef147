r"""mcsd-train: train a language model, log it, leave a checkpoint and a saved model.

    mcsd-train                                  # embedded corpus, MCSD size=small, CPU
    mcsd-train model=transformer size=tiny trainer.max_steps=50
    mcsd-train -m model=mcsd,transformer seed=0,1
    mcsd-train model=rwkv4 model.perspectives=2 init_from=RUN_DIR "trainable=['.*mix_.*','streams\..*']"
Returns the final validation loss, the metric that sweeps optimise.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
import wandb
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from omegaconf import DictConfig, OmegaConf, open_dict
from tokenizers import Tokenizer

from mcsd.checkpoint.lightning_checkpoint import read_checkpoint
from mcsd.checkpoint.run_folder import RESULT_FILE
from mcsd.checkpoint.resume import (
    STOP_SIGNALS,
    WANDB_RUN_KEY,
    RememberRun,
    StopOnSignal,
    requeue_slurm_job,
    resume_config,
)
from mcsd.checkpoint.saved_model import load_tokenizer
from mcsd.cli import hydra_app, parallel_jobs, require_wandb_login
from mcsd.data.datamodule import tokens_per_step as data_tokens_per_step
from mcsd.data.tokenizer import load_tokenizer as load_tokenizer_file
from mcsd.errors import MCSDError
from mcsd.models.build import make_config
from mcsd.models.config import LMConfig
from mcsd.ops.kernels import KERNELS, kernels_problem
from mcsd.training.callbacks import DivergedError, SaveFinalModel, StopOnDivergence
from mcsd.training.fsdp import FSDP2Strategy
from mcsd.training.memory import MemoryPlan, check_fits, peak_resident_bytes, plan_memory
from mcsd.training.module import LanguageModelModule

log = logging.getLogger("mcsd.train")
CHOICE_GROUPS = ("model", "size", "ablation", "data", "trainer", "logger", "experiment", "debug")


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


def _check(cfg: DictConfig) -> None:
    """Refuse settings that cannot work before anything is built or written: every one found,
    a line each (not one mistake per try)."""
    problems = list(_problems(cfg))
    if problems:
        raise MCSDError("\n".join(problems))


def _problems(cfg: DictConfig) -> Iterator[str]:
    if cfg.get("trainable") is not None and cfg.get("init_from") is None and cfg.get("ckpt_path") is None:
        yield (f"trainable={list(cfg.trainable)} trains part of a model that starts from scratch: "
               "set init_from=RUN_DIR (the trained model to fine-tune) or trainable=null")
    for key in ("seq_len", "batch_size"):
        value = cfg.data.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            yield f"data.{key}={value} must be a positive whole number"
    interval = cfg.trainer.get("val_check_interval")
    if interval is not None and (isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0
                                 or (isinstance(interval, float) and interval > 1)):
        yield (f"trainer.val_check_interval={interval} must be a number of steps (1 or more) or a fraction of an "
               "epoch in (0, 1]")
    if not isinstance(cfg.get("compile"), bool):
        yield f"compile={cfg.get('compile')} must be true or false"
    accelerator = str(cfg.trainer.get("accelerator"))
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        yield (f"trainer.accelerator={accelerator} needs a CUDA GPU, and none is visible here: train on the CPU "
               "(trainer=default, or trainer=cpu), or run on a machine with one")
    gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    kernels = cfg.model.get("kernels", "auto")
    if kernels in KERNELS and (problem := kernels_problem(kernels, "cuda" if gpu else "cpu")):
        yield problem
    max_steps, max_epochs = cfg.trainer.get("max_steps"), cfg.trainer.get("max_epochs")
    if cfg.data.get("token_budget") is None:
        by_epochs = max_steps == -1 and isinstance(max_epochs, int) and max_epochs >= 1
        if not by_epochs and (not isinstance(max_steps, int) or max_steps < 1):
            yield (f"trainer.max_steps={max_steps} must be a positive number of steps "
                   "(or set data.token_budget=TOKENS, or trainer.max_steps=-1 with trainer.max_epochs=N)")
    yield from _optimization_problems(cfg.get("optimizer"), cfg.get("scheduler"),
                                      max_steps if cfg.data.get("token_budget") is None else None)


def _optimization_problems(optimizer: DictConfig | None, scheduler: DictConfig | None,
                           steps: int | None) -> Iterator[str]:
    """The optimizer's and the schedule's settings, as torch would refuse them mid-start (the
    learning rate, betas, eps, weight decay) or as would silently bend the schedule (a warm-up
    as long as the run)."""
    def number(node: DictConfig, key: str) -> tuple[float | None, str | None]:
        value = node.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            return None, f"{node._key()}.{key}={value} must be a number"
        return value, None

    if optimizer is not None:
        checked = {key: number(optimizer, key) for key in ("lr", "eps", "weight_decay")}
        yield from (problem for _, problem in checked.values() if problem)
        lr, eps, decay = (checked[key][0] for key in ("lr", "eps", "weight_decay"))
        if lr is not None and lr < 0:
            yield f"optimizer.lr={lr} must be 0 or more (the paper's 8e-4 is the default)"
        if eps is not None and eps < 0:
            yield f"optimizer.eps={eps} must be 0 or more"
        if decay is not None and decay < 0:
            yield f"optimizer.weight_decay={decay} must be 0 or more"
        betas = optimizer.get("betas")
        if betas is not None and (len(betas) != 2 or not all(isinstance(beta, (int, float)) and 0 <= beta < 1
                                                             for beta in betas)):
            yield f"optimizer.betas={list(betas)} must be two numbers in [0, 1), e.g. [0.9, 0.95]"
    warmup = scheduler.get("warmup_steps") if scheduler is not None else None
    if warmup is None or warmup == "auto":
        return
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
        yield f"scheduler.warmup_steps={warmup} must be auto (a tenth of the run) or a whole number of steps, 0 or more"
    elif isinstance(steps, int) and steps >= 1 and warmup > steps:
        yield (f"scheduler.warmup_steps={warmup} is longer than the run (trainer.max_steps={steps}): give at most "
               f"{steps} (or auto: a tenth of the run, {max(steps // 10, 1)}), or more trainer.max_steps")


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


def _memory_plan(cfg: DictConfig, model_config: LMConfig) -> MemoryPlan:
    """This process's memory plan for the composed run (:mod:`mcsd.training.memory`)."""
    trainer = cfg.trainer
    gpu = trainer.accelerator in ("gpu", "cuda") or (trainer.accelerator == "auto" and torch.cuda.is_available())
    devices = trainer.devices if isinstance(trainer.devices, int) else (torch.cuda.device_count() if gpu else 1)
    sharded = "FSDP2Strategy" in str(OmegaConf.select(cfg, "trainer.strategy._target_", default=""))
    mixed = OmegaConf.select(cfg, "trainer.strategy.mixed_precision", default="fp32")
    if "bf16" in str(trainer.precision) or mixed == "bf16" or (mixed == "auto" and gpu):
        compute = torch.bfloat16
    else:
        compute = torch.float16 if "16" in str(trainer.precision) else torch.float32
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    return plan_memory(model_config, cfg.data.batch_size, cfg.data.seq_len, devices * trainer.get("num_nodes", 1), devices,
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


def _loggers(cfg: DictConfig) -> list[Logger]:
    loggers = []
    run_id = read_checkpoint(cfg.ckpt_path).get(WANDB_RUN_KEY) if cfg.ckpt_path else None
    for name, node in (cfg.get("logger") or {}).items():
        if node is None:
            continue
        if "_target_" not in node:
            raise MCSDError(f"logger.{name} has no _target_: give it one or remove it (logger=none for no logging)")
        if "Wandb" in node._target_ and not node.get("offline", False):
            require_wandb_login(f"logger.{name}")
        extra = {"id": run_id, "resume": "allow"} if run_id and "Wandb" in node._target_ else {}
        loggers.append(instantiate(node, **extra))
    return loggers


def _choices() -> dict[str, Any]:
    choices = HydraConfig.get().runtime.choices
    return {group: choices.get(group) for group in CHOICE_GROUPS}


def train(cfg: DictConfig) -> float:
    """Build data, model, loggers, callbacks and trainer from ``cfg``; fit; return val/loss."""
    _length_as_typed(cfg)
    _check(cfg)
    model_config = make_config(cfg.model)  # resolved once (equal-size widths): the plan and the module share it
    plan = _memory_plan(cfg, model_config)  # before anything is allocated
    log.info(plan.line())
    L.seed_everything(cfg.seed, workers=True)
    _hold_out_only_what_is_run(cfg)
    tokenizer = _tokenizer_of_weights(cfg)
    datamodule = instantiate(cfg.data, **({"tokenizer": tokenizer} if tokenizer is not None else {}))
    datamodule.build()  # fails fast (one line) on bad data, before any logger starts
    check_fits(plan, "this run")  # after the data: a seq_len longer than the corpus is the data's problem, not memory's
    loggers = _loggers(cfg)
    callbacks = [instantiate(node) for node in (cfg.get("callbacks") or {}).values() if node is not None]
    interrupt = StopOnSignal()
    callbacks += [RememberRun(HydraConfig.get().overrides.task), interrupt,
                  StopOnDivergence(OmegaConf.select(cfg, "optimizer.lr", default=None))]
    if not loggers:  # nothing to report learning rates to (Lightning refuses the monitor then)
        callbacks = [callback for callback in callbacks if not isinstance(callback, LearningRateMonitor)]
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False)
    # A resumed run restores its own weights; a sharded one builds its model on the meta device.
    module = LanguageModelModule(model=model_config, optimizer=instantiate(cfg.optimizer),
                                 scheduler=instantiate(cfg.scheduler), compile=cfg.compile, trainable=cfg.trainable,
                                 init_from=cfg.init_from if cfg.ckpt_path is None else None,
                                 empty_init=isinstance(trainer.strategy, FSDP2Strategy))
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
        logger.log_hyperparams({
            **OmegaConf.to_container(cfg, resolve=True),
            "choices": _choices(),
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
            _write_result({"diverged_at_step": error.step, "val_loss": None, "val_ppl": None, "test_loss": None,
                           "test_ppl": None, "tokens": int(module.tokens_seen), "steps": trainer.global_step})
        raise
    if interrupt.checkpoint is not None:
        _stop(trainer, interrupt)
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
    report = _report(trainer, loggers, callbacks, val_loss, val_ppl, int(module.tokens_seen), train_loss, test,
                     datamodule.describe())
    if trainer.is_global_zero:  # what a sweep's summary reads (mcsd.training.sweep)
        _write_result({"val_loss": val_loss, "val_ppl": val_ppl, "test_loss": test[0] if test else None,
                       "test_ppl": test[1] if test else None, "tokens": int(module.tokens_seen),
                       "steps": trainer.global_step})
    wandb.finish()  # before the report, so that the report is what the run prints last
    if trainer.is_global_zero:
        print(report, flush=True)
    return val_loss


def _write_result(result: dict[str, Any]) -> None:
    """``result.json`` in the run folder, as valid JSON: a value that is not finite is null."""
    plain = {key: None if isinstance(value, float) and not math.isfinite(value) else value
             for key, value in result.items()}
    (Path(HydraConfig.get().runtime.output_dir) / RESULT_FILE).write_text(json.dumps(plain, indent=2) + "\n")


def _stop(trainer: L.Trainer, interrupt: StopOnSignal) -> None:
    """End a run that a signal stopped: one line naming its checkpoint and how it goes on, exit
    status 128 + the signal. Under SLURM, a run stopped by anything but Ctrl-C puts its job back
    in the queue, and the job goes on from that checkpoint when it starts again."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    wandb.finish()
    if trainer.is_global_zero:
        signal_name = STOP_SIGNALS[interrupt.signum]
        job = requeue_slurm_job() if signal_name != "Ctrl-C" else None
        then = (f"SLURM job {job} requeued: it goes on from this checkpoint when it starts again" if job else
                f"resume with `mcsd-train resume={run_dir}`")
        print(f"mcsd-train: interrupted at step {trainer.global_step}: checkpoint {interrupt.checkpoint}; {then} "
              f"({signal_name}; the final model folder is written only for a finished run)", file=sys.stderr, flush=True)
    if parallel_jobs() > 1:  # a job of a sweep run side by side: its worker ends too, instead of taking the next job
        for logger in trainer.loggers:
            logger.save()
        sys.stdout.flush()
        os._exit(128 + interrupt.signum)
    raise SystemExit(128 + interrupt.signum)


def _report(trainer: L.Trainer, loggers: list[Logger], callbacks: list[L.Callback], val_loss: float,
            val_ppl: float, tokens: int, train_loss: torch.Tensor | None = None,
            test: tuple[float, float] | None = None, data: dict[str, Any] | None = None) -> str:
    """The closing lines: the result on each held-out split (which documents it is) and where every artefact is."""
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
    if "val/mqar_acc" in trainer.callback_metrics:
        lines.append(f"final validation MQAR accuracy: {float(trainer.callback_metrics['val/mqar_acc']):.4f}")
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            run = logger.experiment
            run_dir = Path(run.dir).parent
            where = f"{run_dir} (offline; upload with `wandb sync {run_dir}`)" if run.settings._offline else run.url
            lines.append(f"W&B run {run.id}: {where}")
        if isinstance(logger, CSVLogger):
            lines.append(f"CSV metrics: {Path(logger.log_dir) / 'metrics.csv'}")
    if trainer.checkpoint_callback is not None and trainer.checkpoint_callback.last_model_path:
        lines.append(f"checkpoint: {trainer.checkpoint_callback.last_model_path}")
    for callback in callbacks:
        if isinstance(callback, SaveFinalModel):
            lines.append(f"model: {callback.dirpath} (mcsd-generate ckpt={callback.dirpath} prompt=\"...\")")
    return "\n".join(lines)


@hydra_app("mcsd-train", "train")
def main(cfg: DictConfig) -> float:
    """Entry point of ``mcsd-train``: one line and exit status 2 for a setting that cannot work."""
    try:
        return train(resume_config(cfg))
    finally:
        wandb.finish()  # multirun jobs must not share a run


if __name__ == "__main__":
    main()
