"""What the command-line apps share: config resolvers, the arms sweeper and one-line errors."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hydra.core.plugins import Plugins
from omegaconf import OmegaConf

from mcsd.errors import MCSDError

Result = TypeVar("Result")

# ${mcsd.wandb_offline:} is true unless WANDB_MODE=online.
OmegaConf.register_new_resolver("mcsd.wandb_offline", lambda: os.environ.get("WANDB_MODE", "offline") != "online",
                                replace=True)


def _register_arms_sweeper() -> None:
    """``hydra/sweeper=arms``. Hydra's scan of ``hydra_plugins`` finds it in a regular install
    but not in an editable one (the editable finder's path hook cannot be listed), so it is
    registered by hand. The scan re-executes plugin modules already imported, so it runs
    first (``Plugins.instance()``) and the sweeper is imported after it."""
    plugins = Plugins.instance()
    plugins.register(importlib.import_module("hydra_plugins.mcsd_arms_sweeper").ArmsSweeper)


_register_arms_sweeper()


def run_or_exit(app: str, function: Callable[[], Result]) -> Result:
    """Run ``function``; a setting or file that cannot work ends the app with one line on
    stderr and exit status 2 instead of a traceback."""
    try:
        return function()
    except (MCSDError, FileNotFoundError) as error:
        print(f"{app}: error: {error}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def git_commit() -> str:
    """The commit of the checkout the command runs from (``unknown`` outside a git checkout)."""
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                                text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return result.stdout.strip() if result.returncode == 0 else "unknown"
