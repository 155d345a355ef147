"""What a run tells W&B about itself, so that a dashboard reads it without the command line: its
group (the sweep invocation it belongs to, or the run alone), a name and tags that say what it
trains, its own overrides and the code's commit in the config, and a summary and exit code that say
how it ended (docs/training.md, "Reading a sweep in W&B"); and a measuring command's run
(:class:`MeasurementRun`: bench, eval, probe), which names the training runs it measured."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import wandb
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig

from mcsd.errors import MCSDError
from mcsd.models import registry
from mcsd.models.config import LMConfig
from mcsd.runtime import git_commit

log = logging.getLogger(__name__)
GROUP_KEY = "wandb_group"  # the checkpoint's record of its run's group and name (a resumed run keeps them)
NAME_KEY = "wandb_name"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as the process; the signal's own 128 + n where another stopped it


@dataclasses.dataclass(frozen=True)
class RunIdentity:
    """A run's W&B group, name and tags, and the config keys that say where it comes from."""

    group: str
    name: str
    tags: list[str]
    config: dict[str, Any]


def invocation_folder() -> tuple[str, bool]:
    """The folder that names this invocation's W&B group, and whether it is a ``-m`` sweep's:
    the sweep folder (every job of one invocation), else the run's own folder."""
    hydra = HydraConfig.get()
    sweep = hydra.mode == RunMode.MULTIRUN
    return Path(hydra.sweep.dir if sweep else hydra.runtime.output_dir).name, sweep


def run_identity(cfg: DictConfig, model_config: LMConfig, resumed: Mapping[str, Any] | None = None) -> RunIdentity:
    """The identity of the run ``cfg`` composes. Group: ``<experiment>/<sweep folder>`` for a job of a
    ``-m`` sweep (every job of one invocation; a resumed or requeued sweep keeps its folder), else
    ``<experiment>/<run folder>``; name ``<arch>-<variant>-<size>-seed<seed>``, then ``-job<n>`` in a sweep
    (unique inside it); tags: the experiment's, the experiment, architecture, variant, size and data.
    ``resumed``: the checkpoint a resumed run goes on from, whose group and name it keeps. A
    ``logger.wandb.group`` or ``name`` given in the config wins over these."""
    hydra = HydraConfig.get()
    architecture = registry.of_config(model_config)
    variant = architecture.variant_of(dataclasses.asdict(model_config))
    size = hydra.runtime.choices.get("size") or "custom"
    data = hydra.runtime.choices.get("data") or "custom"
    experiment = str(cfg.experiment_name)
    folder, sweep = invocation_folder()
    name = f"{architecture.name}-{variant}-{size}-seed{cfg.seed}" + (f"-job{hydra.job.num}" if sweep else "")
    group = f"{experiment}/{folder}"
    if resumed:
        group, name = resumed.get(GROUP_KEY, group), resumed.get(NAME_KEY, name)
    tags = list(dict.fromkeys([*map(str, cfg.get("tags") or []), experiment, architecture.name, variant, size, data]))
    return RunIdentity(group, name, tags, {
        "experiment": experiment, "sweep": folder if sweep else None,
        "job/overrides": list(hydra.overrides.task), "git_commit": git_commit()})


def wandb_arguments(node: Mapping[str, Any], identity: RunIdentity) -> dict[str, Any]:
    """What a W&B logger node is instantiated with beside its own keys: the identity's group, name
    and tags where the node leaves them empty."""
    arguments = {key: value for key, value in (("group", identity.group), ("name", identity.name)) if not node.get(key)}
    arguments["tags"] = list(dict.fromkeys([*(node.get("tags") or []), *identity.tags]))
    return arguments


class RememberIdentity(L.Callback):
    """Store the run's W&B group and name in every checkpoint, so that the run resumed from it keeps them."""

    def __init__(self, identity: RunIdentity) -> None:
        self.identity = identity

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint[GROUP_KEY], checkpoint[NAME_KEY] = self.identity.group, self.identity.name


class BestValidation(L.Callback):
    """The lowest validation perplexity so far and the tokens at which it was reached, in the W&B
    summary (``val/ppl_best``, ``val/tokens_at_best``) as they change."""

    def __init__(self) -> None:
        self.best: float | None = None
        self.tokens: int | None = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ppl = trainer.callback_metrics.get("val/ppl")
        if trainer.sanity_checking or ppl is None or not float(ppl) == float(ppl):
            return
        if self.best is None or float(ppl) < self.best:
            self.best, self.tokens = float(ppl), int(pl_module.tokens_seen)
            update_summary(trainer, {"val/ppl_best": self.best, "val/tokens_at_best": self.tokens})

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "tokens": self.tokens}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best, self.tokens = state_dict["best"], state_dict["tokens"]


def update_summary(trainer: L.Trainer, values: Mapping[str, Any]) -> None:
    """``values`` into the summary of each W&B run the trainer logs to (on the process that logs)."""
    if not trainer.is_global_zero:
        return
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            logger.experiment.summary.update(dict(values))


def finish_wandb(exit_code: int, summary: Mapping[str, Any] | None = None) -> None:
    """End this process's W&B run (if one is open) with the process's exit code, ``summary`` in its
    summary first: a diverged run ends 2, an interrupted one 128 + the signal, a crash 1. W&B's
    service is then shut down, so that the run's file is whole on disk when this returns (the
    service writes it after ``finish`` returns) and a later run in this process (a sweep's next
    job, a notebook's) sets W&B up from its own settings."""
    if wandb.run is not None and summary:
        wandb.run.summary.update(dict(summary))
    wandb.finish(exit_code=exit_code)
    wandb.teardown()


def exit_code_of(error: BaseException) -> int:
    """The exit status the process ends with for ``error``, as :func:`mcsd.commands.app.run_or_exit`
    ends it (a refused setting, a missing file or a divergence: 2, Ctrl-C: 130, ``SystemExit``: its
    own, anything else: 1)."""
    if isinstance(error, SystemExit):
        return error.code if isinstance(error.code, int) else 0 if error.code is None else 1
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return 2 if isinstance(error, (MCSDError, FileNotFoundError, PermissionError)) else 1


def offline_run_folders(run_id: str, root: Path) -> list[Path]:
    """Every offline folder of W&B run ``run_id`` under ``root`` (the log folder): a run resumed in a
    new run directory leaves one in each, all of which ``wandb sync`` needs to upload the whole run."""
    return sorted(path for path in Path(root).rglob(f"offline-run-*-{run_id}") if path.is_dir())


class MeasurementRun:
    """The W&B run of a measuring command (``mcsd-bench``, ``mcsd-eval``, ``mcsd-probe context``),
    opened at its first measurement (a command stopped before one leaves no W&B run): group
    ``<command>/<invocation folder>``, the command as its job type and tag, the git commit and the W&B
    ids of the training runs whose models it measures (``trained_runs``; online, their
    ``model-<id>:final`` artifacts are declared as its inputs, so that the dashboard's lineage links
    them). Each measurement is a row as it comes and its key numbers go into the summary at once, so
    that an interrupted run keeps what it measured; used as a context manager it ends with the
    process's exit code."""

    def __init__(self, command: str, settings: Mapping[str, Any], config: Mapping[str, Any], output_dir: Path,
                 measured: list[str | Path] | tuple[str | Path, ...] = ()) -> None:
        self.command, self.settings, self.config, self.measured = command, settings, dict(config), list(measured)
        self.output_dir = Path(output_dir)
        self.run: Any = None
        self.exit_code = 0  # what the run ends with when no error ends it (a measurement stopped by Ctrl-C: 130)

    def _trained_runs(self) -> list[str]:
        from mcsd.checkpoint.saved_model import trained_wandb_run

        trained = []
        for path in self.measured:
            try:
                run_id = trained_wandb_run(path)
            except (MCSDError, OSError):  # not a saved model (a size's random weights): nothing to link
                run_id = None
            if run_id and run_id not in trained:
                trained.append(run_id)
        return trained

    def _group_folder(self) -> str:
        """A -m sweep's folder for its jobs (whose output folders lie in it), else the output folder's name
        (a run alone, or a command called from Python, where Hydra's config may be an earlier app's)."""
        if HydraConfig.initialized():
            hydra = HydraConfig.get()
            sweep = Path(hydra.sweep.dir).absolute()
            if hydra.mode == RunMode.MULTIRUN and sweep in self.output_dir.absolute().parents:
                return sweep.name
        return self.output_dir.name

    def _start(self) -> Any:
        if self.run is not None:
            return self.run
        folder = self._group_folder()
        trained = self._trained_runs()
        offline = bool(self.settings.get("offline"))
        self.run = wandb.init(project=self.settings.get("project"), entity=self.settings.get("entity"),
                              group=f"{self.command}/{folder}", name=f"{self.command}-{folder}", job_type=self.command,
                              tags=[self.command], dir=str(self.output_dir),
                              mode="offline" if offline else "online",
                              config={**self.config, "git_commit": git_commit(), "trained_runs": trained},
                              # no system-metrics sampling beside the measurements (a benchmark's busy cores)
                              settings=wandb.Settings(x_disable_stats=True))
        if not offline:
            for run_id in trained:
                try:
                    self.run.use_artifact(f"model-{run_id}:final")
                except Exception as error:  # noqa: BLE001  trained with log_model=false, or in another project
                    log.warning("W&B: no model artifact of training run %s to link (%s): trained_runs names it", run_id,
                                error)
        return self.run

    def record(self, row: Mapping[str, Any], summary: Mapping[str, Any] | None = None) -> None:
        """One measurement: ``row``'s numbers as a history row, ``summary`` into the summary."""
        run = self._start()
        numbers = {key: value for key, value in row.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool)}
        if numbers:
            run.log(numbers)
        if summary:
            run.summary.update(dict(summary))

    def table(self, key: str, frame: Any) -> None:
        """Every measurement so far as one W&B table (a ``pandas.DataFrame``)."""
        self._start().log({key: wandb.Table(dataframe=frame)})

    def __enter__(self) -> MeasurementRun:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: Any) -> bool:
        if self.run is not None:
            finish_wandb(self.exit_code if error is None else exit_code_of(error))
        return False
