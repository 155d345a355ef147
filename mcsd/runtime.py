"""What a long piece of work shares with the command that runs it, without the command's plumbing:
the end of an app that Ctrl-C stopped (:func:`interrupted`; the loop it stops is :mod:`mcsd.jobs`), the
torch threads a ``threads`` setting asks for, the jobs of a sweep side by side, an online W&B
login checked before it is needed, the command that uploads offline W&B runs, and the commit of the checkout."""

from __future__ import annotations

import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlparse

from omegaconf import DictConfig, open_dict

from mcsd.errors import MCSDError


def quiet_torchao_import() -> None:
    """Import torchao (where installed) without, on a CPU build of torch, its line per CUDA library
    that such a build cannot load (``Failed to load ..._C_cutlass_90a.abi3.so``): its CPU kernels
    are torch's own. transformers imports it at ``import mcsd`` where it is installed."""
    import importlib
    import importlib.util

    import torch

    if importlib.util.find_spec("torchao") is None or "torchao" in sys.modules:
        return
    # And torch's line per enum torchao registers the old way (a deprecation of torch 2.13's pytree).
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers if torch.version.cuda is None else loggers[1:]:
        logger.setLevel(logging.ERROR)
    try:
        for module in ("torchao", "torchao.prototype.mx_formats"):  # what transformers imports of it
            importlib.import_module(module)
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def interrupted(app: str, kept: str) -> NoReturn:
    """End an app that Ctrl-C stopped: one line saying what it kept, exit status 130."""
    print(f"{app}: interrupted (Ctrl-C): {kept}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C more while the app exits changes nothing
    raise SystemExit(128 + signal.SIGINT)


def parallel_jobs() -> int:
    """How many jobs of this Hydra sweep run side by side here (the joblib launcher's n_jobs), else 1."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return 1
    hydra_cfg = HydraConfig.get()
    n_jobs = hydra_cfg.launcher.get("n_jobs") if "joblib" in str(hydra_cfg.launcher.get("_target_", "")) else None
    return n_jobs if str(hydra_cfg.mode) == "RunMode.MULTIRUN" and isinstance(n_jobs, int) and n_jobs > 1 else 1


def torch_threads(setting: int | str | None) -> tuple[int, str]:
    """The torch threads a ``threads`` setting asks for, and why: a number as given; ``auto``
    (the default): ``OMP_NUM_THREADS`` when set, else torch's default less the cores other work
    keeps busy (the 1-minute load average), at least 1, since OpenMP threads that share their
    cores with other work spin and run several times slower; ``null``: torch's default."""
    import torch

    default = torch.get_num_threads()
    if setting is None:
        return default, "threads=null: torch's default"
    if setting == "auto":
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():
            return max(1, int(os.environ["OMP_NUM_THREADS"])), f"threads=auto: OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
        cores, load, jobs = len(os.sched_getaffinity(0)), os.getloadavg()[0], parallel_jobs()
        if jobs > 1:  # a sweep's jobs side by side share the cores
            return max(1, min(default, cores // jobs)), f"threads=auto: {cores} cores, {jobs} jobs side by side"
        threads = max(1, min(default, round(cores - load)))
        return threads, f"threads=auto: {cores} cores, load {load:.1f}, torch's default {default}"
    if isinstance(setting, int) and not isinstance(setting, bool) and setting >= 1:
        return setting, f"threads={setting}"
    raise MCSDError(f"threads={setting} must be a positive number of torch threads, auto or null")


def apply_threads(app: str, cfg: DictConfig) -> None:
    """Set torch's threads from ``cfg.threads`` (resolved to a number in the config, for what the
    command hands on) and say so in the command's log (its console and log file)."""
    if "threads" not in cfg:
        return
    import torch

    threads, why = torch_threads(cfg.threads)
    torch.set_num_threads(threads)
    if cfg.threads is not None:
        with open_dict(cfg):
            cfg.threads = threads
    logging.getLogger("mcsd").info("%s: %d torch thread%s (%s)", app, threads, "s" if threads > 1 else "", why)


def apply_flush_denormal(app: str, cfg: DictConfig) -> None:
    """``flush_denormal: true``: the CPU treats denormal floats (below 1.2e-38 in fp32) as zero
    (``torch.set_flush_denormal``), and the command's log says so. Arithmetic on denormals runs
    many times slower on x86; a run whose activations decay into their range steps slower for it
    (``docs/training.md``). A CPU that cannot (no SSE3) is refused in one line. No effect on a GPU."""
    setting = cfg.get("flush_denormal")
    if setting is None or setting is False:
        return
    if setting is not True:
        raise MCSDError(f"flush_denormal={setting} must be true or false")
    import torch

    if not torch.set_flush_denormal(True):
        raise MCSDError("flush_denormal=true: this CPU cannot flush denormals (torch.set_flush_denormal needs SSE3 "
                        "on x86): set flush_denormal=false")
    logging.getLogger("mcsd").info("%s: denormal floats flushed to zero on the CPU (flush_denormal=true)", app)


def require_wandb_login(setting: str) -> None:
    """Online W&B needs an API key: say how to get one (or stay offline) instead of W&B's traceback."""
    import wandb

    offline = "stay offline (unset WANDB_MODE; logger.wandb.offline=true) and upload later with `wandb sync`"
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
    if os.environ.get("WANDB_API_KEY") or _netrc_has(host.hostname):  # a key W&B would check with its server
        try:  # which W&B itself tries for about 20 s, ending in a traceback
            socket.create_connection((host.hostname, host.port or (443 if host.scheme == "https" else 80)),
                                     timeout=5).close()
        except OSError:
            raise MCSDError(f"{setting} uses W&B online, but its server ({host.hostname}) is unreachable from here: "
                            f"{offline}") from None
    if not wandb.login(prompt=False):
        wandb.teardown()  # the failed login set W&B up online for this process: later offline runs in it stay offline
        raise MCSDError(f"{setting} uses W&B online but no W&B API key is set: run `wandb login` (or set "
                        f"WANDB_API_KEY), or {offline}")


def sync_command(folders: list[Path]) -> str:
    """The one ``wandb sync`` command that uploads ``folders`` (offline runs, or globs of them)."""
    return "wandb sync " + " ".join(str(folder) if "*" in str(folder) else shlex.quote(str(folder)) for folder in folders)


def _netrc_has(host: str | None) -> bool:
    """Whether ``~/.netrc`` (where ``wandb login`` keeps the key) has an entry for ``host``."""
    import netrc

    try:
        return host is not None and netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def git_commit() -> str:
    """The commit of the checkout the command runs from (``unknown`` outside a git checkout)."""
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                                text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return result.stdout.strip() if result.returncode == 0 else "unknown"
