"""``hydra/launcher=slurm``: submitit's SLURM launcher, refusing (in one line, before anything is
submitted) a job whose SLURM resources disagree with its trainer: Lightning starts one process per
device and takes its ranks from SLURM's tasks, so ``tasks_per_node`` must equal
``trainer.devices``, ``nodes`` ``trainer.num_nodes``, and a GPU trainer needs a GPU per task."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import DictConfig


def resource_mismatch(cfg: DictConfig) -> str | None:
    """What in a composed job config's SLURM resources disagrees with its trainer, or ``None``."""
    launcher, trainer = cfg.hydra.launcher, cfg.trainer
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1)
    if isinstance(devices, int) and launcher.tasks_per_node != devices:
        return (f"hydra.launcher.tasks_per_node={launcher.tasks_per_node} but trainer.devices={devices}: Lightning "
                "starts one process per device, SLURM one task each: make them equal (or leave "
                "hydra.launcher.tasks_per_node alone: it follows trainer.devices)")
    if launcher.nodes != nodes:
        return (f"hydra.launcher.nodes={launcher.nodes} but trainer.num_nodes={nodes}: make them equal (or leave "
                "hydra.launcher.nodes alone: it follows trainer.num_nodes)")
    gpus = launcher.get("gpus_per_node") or 0
    if trainer.get("accelerator") in ("gpu", "cuda") and isinstance(devices, int) and gpus < devices:
        return (f"hydra.launcher.gpus_per_node={gpus} but trainer.devices={devices} GPUs per node: ask for a GPU "
                "per device (or leave hydra.launcher.gpus_per_node alone)")
    return None


class TrainerSlurmLauncher(SlurmLauncher):
    """submitit's ``SlurmLauncher``, with each job's resources checked against its trainer first."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        for overrides in job_overrides:
            job_cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            problem = resource_mismatch(job_cfg)
            if problem is not None:
                print(f"{Path(sys.argv[0]).name}: error: {problem}", file=sys.stderr, flush=True)
                raise SystemExit(2)
        return super().launch(job_overrides, initial_job_idx)
