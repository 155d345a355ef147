"""What ``mcsd-train`` refuses before anything is allocated or written: every setting of a composed
config that cannot work, a line each (not one mistake per try)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from mcsd.checkpoint.run_folder import RunFolder
from mcsd.data.tokens import DOCUMENTS
from mcsd.errors import MCSDError
from mcsd.models import CausalLM
from mcsd.ops.kernels import KERNELS, kernels_problem


def check_run(cfg: DictConfig, model: CausalLM | None = None) -> None:
    """Refuse settings that cannot work before anything is allocated or written: every one found,
    a line each (not one mistake per try). ``model``: the run's model, built once on the meta
    device (what it can do; ``None``: settings that need it are not checked)."""
    problems = list(run_problems(cfg, model))
    if problems:
        raise MCSDError("\n".join(problems))


def run_problems(cfg: DictConfig, model: CausalLM | None = None) -> Iterator[str]:
    """Each setting of a composed ``mcsd-train`` config (its ``model``, on the meta device) that
    cannot work, in one line naming it and the fix."""
    yield from output_folder_problems(cfg)
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
    yield from documents_problems(cfg, model)
    yield from task_problems(cfg)
    yield from optimization_problems(cfg.get("optimizer"), cfg.get("scheduler"),
                                      max_steps if cfg.data.get("token_budget") is None else None)


def optimization_problems(optimizer: DictConfig | None, scheduler: DictConfig | None,
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


COMPRESSION_UNDER_FSDP = ("data.task=compression reads the model's hidden states outside its forward call, which "
                          "trainer=fsdp does not gather: train it with trainer=cpu or trainer=gpu")


def task_problems(cfg: DictConfig) -> Iterator[str]:
    """A synthetic task (``data.task``, MAD's and retrieval's) the model cannot take: ids beyond its
    vocabulary, or compression's decoder under sharding (it reads the hidden states outside the
    model's forward call, which FSDP2 does not gather)."""
    task, model = cfg.data.get("task"), cfg.get("model")
    if task is None or model is None:
        return
    vocabulary = cfg.data.get("vocab_size")
    if isinstance(vocabulary, int) and isinstance(model.get("vocab_size"), int) and model.vocab_size < vocabulary:
        yield (f"model.vocab_size={model.vocab_size} is smaller than data.vocab_size={vocabulary}, the ids of "
               f"data.task={task}: raise model.vocab_size (model.vocab_size=${{data.vocab_size}} follows the task)")
    strategy = cfg.trainer.get("strategy")
    target = str(strategy.get("_target_", "")) if isinstance(strategy, DictConfig) else str(strategy)
    if task == "compression" and target.endswith("FSDP2Strategy"):
        yield COMPRESSION_UNDER_FSDP


def documents_problems(cfg: DictConfig, model: CausalLM | None) -> Iterator[str]:
    """``data.documents``: one of :data:`DOCUMENTS`; ``apart`` only for a model (the run's, on the
    meta device) whose every layer keeps the documents of a packed batch apart."""
    documents = cfg.data.get("documents", "joined")
    if documents not in DOCUMENTS:
        yield f"data.documents={documents} is unknown: use one of {', '.join(DOCUMENTS)}"
    elif documents == "apart" and model is not None and (problem := model.documents_apart_problem()) is not None:
        yield f"data.documents=apart: {problem}"


# Where a process of a multi-process run learns its rank (Lightning's launcher, torchrun, SLURM).
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")


def output_folder_problems(cfg: DictConfig) -> Iterator[str]:
    """A run's folder (``paths.output_dir``) that already holds another run: a new run there would
    replace its checkpoints, model and config and append to its metrics, one folder holding two
    runs. A run that goes on from a checkpoint in that folder (``resume=`` it, or a requeued job
    in its own folder) is that run, resumed."""
    from hydra.core.hydra_config import HydraConfig

    value = OmegaConf.select(cfg, "paths.output_dir", default=None)
    if value is None or any(os.environ.get(name, "0") != "0" for name in RANK_VARIABLES):
        return  # the first process looks, before any writes: the others start in its folder (DDP, FSDP, SLURM)
    folder = Path(value).expanduser().absolute()
    found = RunFolder(folder).holds_a_run()
    resumed_here = cfg.get("ckpt_path") and folder in Path(cfg.ckpt_path).expanduser().absolute().parents
    if not found or resumed_here:
        return
    own = HydraConfig.initialized() and Path(HydraConfig.get().runtime.output_dir).absolute() == folder
    setting = f"hydra.run.dir={value}" if own else f"paths.output_dir={value}"
    log_dir = OmegaConf.select(cfg, "paths.log_dir", default="logs")
    resume = f"go on with that run (resume={value}), or " if RunFolder(folder).latest_checkpoint() else ""
    yield (f"{setting} holds a run already ({', '.join(found)}): a new run there would mix its files with that "
           f"run's; {resume}choose a new folder, or leave {setting.split('=')[0]} out (each run gets a folder of its "
           f"own under {log_dir}/train/runs)")
