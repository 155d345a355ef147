"""What the command-line apps share: config resolvers and one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from omegaconf import OmegaConf

from mcsd.errors import MCSDError

Result = TypeVar("Result")

# ${mcsd.wandb_offline:} is true unless WANDB_MODE=online.
OmegaConf.register_new_resolver("mcsd.wandb_offline", lambda: os.environ.get("WANDB_MODE", "offline") != "online",
                                replace=True)


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
