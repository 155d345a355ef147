"""What the command-line apps share: config resolvers, the arms sweeper, and the bad-input
rules (one line on stderr, exit status 2, no run folder left behind)."""

from __future__ import annotations

import functools
import importlib
import logging
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn, TypeVar

import hydra
from hydra.core.plugins import Plugins
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from mcsd.errors import MCSDError

Result = TypeVar("Result")

# Third-party warnings that say nothing about the user's settings, each matched by its text.
THIRD_PARTY_WARNINGS = (
    r"'set_vital' is deprecated",  # torchdata's StatefulDataLoader calls a deprecated torch function
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning's pytree helper on torch 2.13
    r"`torch.jit.script_method` is deprecated",  # a dependency of lm-eval, at import
)
for _message in THIRD_PARTY_WARNINGS:
    warnings.filterwarnings("ignore", message=_message)


class _DropInfo(logging.Filter):
    """Drops Lightning's advertising tips and its note that our model summary replaces its own."""

    PREFIXES = ("\N{ELECTRIC LIGHT BULB} Tip:", "Trainer already configured with model summary callbacks")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.PREFIXES)


logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DropInfo())
# matplotlib's font search warns of each math font it lacks, under Hydra's logging: noise.
logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)

# ${mcsd.wandb_offline:} is true unless WANDB_MODE=online.
OmegaConf.register_new_resolver("mcsd.wandb_offline", lambda: os.environ.get("WANDB_MODE", "offline") != "online",
                                replace=True)
# ${mcsd.times:a,b}, ${mcsd.floordiv:a,b} and ${mcsd.min:a,b}: sizes that follow a swept one (an MLP twice
# the width, a batch that shrinks as sequences grow).
OmegaConf.register_new_resolver("mcsd.times", lambda a, b: int(a) * int(b), replace=True)
OmegaConf.register_new_resolver("mcsd.floordiv", lambda a, b: int(a) // int(b), replace=True)
OmegaConf.register_new_resolver("mcsd.min", lambda a, b: min(int(a), int(b)), replace=True)  # a capped size
# ${mcsd.gpus_per_node:accelerator,devices}: the GPUs a SLURM task set needs (a cluster's auto is its GPUs).
OmegaConf.register_new_resolver("mcsd.gpus_per_node",
                                lambda accelerator, devices: 0 if accelerator == "cpu" else devices, replace=True)


def _register_plugins() -> None:
    """``hydra/sweeper=arms`` and ``hydra/launcher=slurm``'s launcher. Hydra's scan of
    ``hydra_plugins`` finds them in a regular install but not in an editable one (the editable
    finder's path hook cannot be listed), so they are registered by hand. The scan re-executes
    plugin modules already imported, so it runs first (``Plugins.instance()``) and the plugins
    are imported after it."""
    plugins = Plugins.instance()
    plugins.register(importlib.import_module("hydra_plugins.mcsd_arms_sweeper").ArmsSweeper)
    plugins.register(importlib.import_module("hydra_plugins.mcsd_slurm_launcher").TrainerSlurmLauncher)


_register_plugins()


def fail(app: str, message: str) -> NoReturn:
    """End the app with one line on stderr and exit status 2."""
    print(f"{app}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def run_or_exit(app: str, function: Callable[[], Result]) -> Result:
    """Run ``function``; a setting or file that cannot work ends the app with one line on
    stderr and exit status 2 instead of a traceback."""
    try:
        return function()
    except (MCSDError, FileNotFoundError) as error:
        fail(app, str(error))
    except InstantiationException as error:  # a config object that refused its settings
        if not isinstance(error.__cause__, MCSDError):
            raise
        fail(app, str(error.__cause__))


def require_values(cfg: DictConfig) -> None:
    """Every ``???`` of the config has been given a value."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise MCSDError(f"{missing[0]} is missing: give it on the command line ({missing[0]}=...)")


def require_wandb_login(setting: str) -> None:
    """Online W&B needs an API key: say how to get one (or stay offline) instead of W&B's traceback."""
    import wandb

    if not wandb.login(prompt=False):
        raise MCSDError(f"{setting} uses W&B online but no W&B API key is set: run `wandb login` (or set "
                        "WANDB_API_KEY), or stay offline (unset WANDB_MODE; logger.wandb.offline=true)")


def _group_options(config_name: str, argv: list[str]) -> Iterator[tuple[str, str, list[str]]]:
    """``(group, value, options)`` for each ``group=value`` of ``argv`` whose group is a config group."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    with initialize_config_module("mcsd.conf", version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        for argument in argv:
            if argument.startswith("-") or "=" not in argument:
                continue
            key, value = argument.split("=", 1)
            key = key.lstrip("+~")
            if "(" in value or "." in key or not loader.repository.group_exists(key):
                continue  # a value, or a sweep function (range, glob, ...)
            options = loader.get_group_options(key, results_filter=ObjectType.CONFIG)
            yield key, value, [option for option in options if not option.startswith("_")]


def check_command_line(app: str, config_name: str, argv: list[str]) -> None:
    """Refuse, in one line and before Hydra makes a run folder, a group option that does not
    exist and a launcher that cannot start here."""
    for group, value, options in _group_options(config_name, argv):
        for choice in value.split(","):
            if choice not in options and choice != "null":
                fail(app, f"{group}={choice} is not an option of {group}: use one of {', '.join(options)}")
            if group == "hydra/launcher" and "slurm" in choice and shutil.which("sbatch") is None:
                fail(app, f"hydra/launcher={choice} submits to SLURM, but there is no sbatch here: run on a SLURM "
                          "login node, or use hydra/launcher=local_parallel (or basic)")


def _remove_empty_run_dir() -> None:
    """A run that failed before writing anything leaves no folder (Hydra's own ``.hydra/`` and
    log file do not count)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    written = [path for path in run_dir.rglob("*") if path.is_file()
               and ".hydra" not in path.relative_to(run_dir).parts and path.suffix != ".log"]
    if run_dir.is_dir() and not written:
        shutil.rmtree(run_dir)


def hydra_app(app: str, config_name: str) -> Callable[[Callable[[DictConfig], Result]], Callable[[], Result]]:
    """``@hydra.main`` on ``mcsd.conf/<config_name>``, with this project's bad-input rules: a
    bad group option or launcher is refused before Hydra starts, a missing value or a
    setting that cannot work ends the app in one line (exit status 2), and a run that
    failed before writing anything leaves no run folder."""

    def decorate(task: Callable[[DictConfig], Result]) -> Callable[[], Result]:
        @functools.wraps(task)
        def checked_task(cfg: DictConfig) -> Result:
            try:
                return run_or_exit(app, lambda: (require_values(cfg), task(cfg))[1])
            except SystemExit:
                _remove_empty_run_dir()
                raise

        hydra_main = hydra.main(version_base="1.3", config_path="pkg://mcsd.conf", config_name=config_name)(
            checked_task)

        @functools.wraps(task)
        def entry() -> Result:
            check_command_line(app, config_name, sys.argv[1:])
            return hydra_main()

        return entry

    return decorate


def git_commit() -> str:
    """The commit of the checkout the command runs from (``unknown`` outside a git checkout)."""
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                                text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return result.stdout.strip() if result.returncode == 0 else "unknown"
