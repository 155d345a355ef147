"""Helpers for the training-harness tests: compose configs into tmp_path, run the CLI."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch
import wandb
from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from mcsd.bench.grid import bench
from mcsd.checkpoint.resume import resume_config
from mcsd.commands.app import require_values, run_or_exit
from mcsd.training.run import train

# A tiny, fast run: a few steps of the tiny model on short blocks.
FAST = [
    "size=tiny",
    "data.seq_len=64",
    "data.batch_size=8",
    "trainer.max_steps=6",
    "trainer.val_check_interval=3",
    "trainer.limit_val_batches=2",
    "trainer.log_every_n_steps=1",
    "callbacks.model_checkpoint.every_n_train_steps=3",
    "callbacks.progress_bar.refresh_rate=0",
    "scheduler.warmup_steps=2",
]


def compose_train(output_dir: Path, *overrides: str) -> DictConfig:
    """The ``train`` config as ``mcsd-train`` would see it, writing under ``output_dir``."""
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    with open_dict(cfg):
        cfg.paths.log_dir = str(output_dir.parent / "logs")
        cfg.paths.output_dir = str(output_dir)
        cfg.hydra.runtime.output_dir = str(output_dir)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg.hydra  # a task sees its config without the hydra node
    return cfg


def run_bench(output_dir: Path, *overrides: str) -> Path:
    """``mcsd-bench OVERRIDES`` (W&B off) in this process, writing to ``output_dir``: its results.csv."""
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        cfg = compose("bench", overrides=["wandb.enabled=false", *overrides])
        with open_dict(cfg):
            cfg.output_dir = str(output_dir)
        return bench(cfg)


def train_refusal(output_dir: Path, *overrides: str) -> str:
    """The one line ``mcsd-train OVERRIDES`` prints for a setting that cannot work (its exit
    status 2), got in this process: its task (the resumed run's config, then training) under
    the command's error handling, without starting a Python of its own for each bad input."""
    cfg = compose_train(output_dir, *overrides)
    stderr = io.StringIO()
    try:
        with (initialize_config_module("mcsd.conf", version_base="1.3"), contextlib.redirect_stderr(stderr),
              pytest.raises(SystemExit) as exit_info):
            run_or_exit("mcsd-train", lambda: (require_values(cfg), train(resume_config(cfg))))
    finally:
        wandb.finish()
    errors = [line for line in stderr.getvalue().splitlines() if line.startswith("mcsd-train: error:")]
    assert exit_info.value.code == 2 and len(errors) == 1, stderr.getvalue()[-2000:]
    return errors[0]


def run_here(app: str, *argv: str, env: dict[str, str | None] | None = None,
             cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``app ARGV`` through its console script's own entry point (the command-line checks,
    Hydra, the task and the error handling that the installed command runs), in this process:
    its exit status, stdout and stderr, without starting a Python of its own (about 10 s of
    imports each on the project's machine). ``env``: variables to set, or to remove where the
    value is None, while it runs (W&B offline unless it says otherwise, as in run_cli);
    ``cwd``: the folder it runs in. The working folder, the
    environment, torch's threads and its denormals (which the command sets) are restored after it."""
    (entry,) = entry_points(group="console_scripts", name=app)
    main = entry.load()
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_argv, saved_env, saved_cwd, saved_threads = sys.argv, dict(os.environ), os.getcwd(), torch.get_num_threads()
    sys.argv = [app, *argv]
    if cwd is not None:
        os.chdir(cwd)
    for key, value in {"WANDB_MODE": "offline", **(env or {})}.items():  # as run_cli
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    code = 0
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            main()
    except SystemExit as exit_info:
        code = exit_info.code if isinstance(exit_info.code, int) else 0 if exit_info.code is None else 1
    finally:
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        torch.set_num_threads(saved_threads)
        torch.set_flush_denormal(False)  # torch's default, which flush_denormal=true changes
    return subprocess.CompletedProcess([app, *argv], code, stdout.getvalue(), stderr.getvalue())


def command(app: str) -> str:
    """The installed console script ``app``: beside this Python (a virtual environment's bin/),
    else on ``PATH`` (an install into a --target folder, as the GPU kit makes)."""
    beside = Path(sys.executable).parent / app
    found = str(beside) if beside.is_file() else shutil.which(app)
    if found is None:
        raise FileNotFoundError(f"{app} is neither beside {sys.executable} nor on PATH: install the project")
    return found


def run_cli(*args: str, cwd: Path, env: dict[str, str | None] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """Run an mcsd console script (``mcsd-train``, ...) as a user would, capturing its output
    (``env``: variables to set, or to remove where the value is None)."""
    script = command(args[0])
    # Not this process's W&B service (tests/conftest.py): the command starts its own, as from a shell.
    full_env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", "WANDB_SERVICE": None, **(env or {})}
    full_env = {key: value for key, value in full_env.items() if value is not None}
    return subprocess.run([str(script), *args[1:]], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def read_metrics(run_dir: Path) -> list[dict[str, str]]:
    """The rows of a run's CSV log."""
    with open(run_dir / "csv" / "version_0" / "metrics.csv") as handle:
        return list(csv.DictReader(handle))


def series(rows: list[dict[str, str]], key: str) -> dict[int, float]:
    """``key`` by step, from the rows that logged it."""
    return {int(row["step"]): float(row[key]) for row in rows if row.get(key)}


# A tiny inference grid of mcsd-bench.
TINY_INFERENCE = ["model_size=tiny", "inference.batch_sizes=[1,2]", "inference.gen_lengths=[4,8]",
                  "inference.prompt_len=16", "inference.repeats=2", "inference.warmup=1"]

# A tiny sweep of mcsd-train: a few steps of short blocks, a few validation batches (the whole
# validation split is ~250 of them, most of a job's time), CSV logs.
TINY_SWEEP = ["data.seq_len=32", "data.batch_size=4", "data.token_budget=384", "trainer.val_check_interval=2",
              "trainer.limit_val_batches=4", "trainer.log_every_n_steps=1", "logger=csv", "test_after_training=false",
              "callbacks.progress_bar.refresh_rate=0"]


def sweep_dir(cwd: Path) -> Path:
    (sweep,) = (cwd / "logs" / "train" / "multiruns").iterdir()
    return sweep
