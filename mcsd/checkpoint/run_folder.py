"""One reader of an ``mcsd-train`` run folder: everything a run writes, read back in one place.

A run folder holds::

    .hydra/config.yaml      the composed config       .hydra/overrides.yaml  its command's overrides
    .hydra/hydra.yaml       Hydra's runtime (the config groups chosen: ``choices``)
    csv/version_*/metrics.csv, hparams.yaml   the CSV logger's metrics and the run's logged config
    checkpoints/            last.ckpt and step-*.ckpt (:mod:`mcsd.checkpoint.lightning_checkpoint`)
    result.json             how the run ended (``status``: finished, diverged, refused, interrupted or
                            failed, with the ``reason`` where it did not finish) and a finished run's
                            result (validation and test loss and perplexity)
    model/                  the final model (:mod:`mcsd.checkpoint.saved_model`)

Resuming, the sweep summary, the model card, the plots and the bench read a run through
:class:`RunFolder` (and :func:`csv_logs` for every run under a sweep's folder). Every reader
returns ``None`` (or nothing) for what the run did not write.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mcsd.checkpoint.lightning_checkpoint import CHECKPOINT_DIR, LAST_CHECKPOINT

HYDRA_DIR = ".hydra"
RESULT_FILE = "result.json"
METRICS_FILE = "metrics.csv"
LOGGED_CONFIG_FILE = "hparams.yaml"  # Lightning's name for what a logger's log_hyperparams wrote


# libyaml's safe loader where PyYAML was built with it (its wheels are): the same values, several times
# faster than the pure-Python one, which was most of the time the plots of a sweep took to read its runs.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_SAFE_LOADER)  # noqa: S506 (a safe loader)


def _yaml(path: Path) -> Any:
    return _parse_yaml(path.read_text()) if path.is_file() else None


# How a run ended (``status`` in result.json): a finished run has a result; the others say why not.
FINISHED, DIVERGED, REFUSED, INTERRUPTED, FAILED = "finished", "diverged", "refused", "interrupted", "failed"


def write_result(run_dir: Path, result: dict[str, Any]) -> None:
    """``result.json`` in the run folder, as valid JSON: a value that is not finite is null
    (:meth:`RunFolder.result` reads it back)."""
    plain = {key: None if isinstance(value, float) and not math.isfinite(value) else value
             for key, value in result.items()}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RESULT_FILE).write_text(json.dumps(plain, indent=2) + "\n")


@dataclass(frozen=True)
class RunFolder:
    """The run folder at ``path`` (which need not exist: every reader then finds nothing)."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path).expanduser())

    def overrides(self) -> list[str] | None:
        """The command's overrides (``.hydra/overrides.yaml``)."""
        path = self.path / HYDRA_DIR / "overrides.yaml"
        return list(_yaml(path) or []) if path.is_file() else None

    def config(self) -> dict[str, Any] | None:
        """The composed config (``.hydra/config.yaml``)."""
        return _yaml(self.path / HYDRA_DIR / "config.yaml")

    def choices(self) -> dict[str, Any] | None:
        """The option chosen for each config group (``.hydra/hydra.yaml``: ``runtime.choices``)."""
        hydra = _yaml(self.path / HYDRA_DIR / "hydra.yaml")
        return None if hydra is None else dict(hydra["hydra"]["runtime"]["choices"])

    def metrics_files(self) -> list[Path]:
        """The CSV logger's ``metrics.csv`` of each version, oldest first."""
        return sorted(self.path.glob(f"csv/version_*/{METRICS_FILE}"))

    def metrics(self) -> list[dict[str, str]]:
        """The rows of the latest ``metrics.csv`` (none where the run logged no CSV)."""
        files = self.metrics_files()
        if not files:
            return []
        with files[-1].open() as file:
            return list(csv.DictReader(file))

    def logged_config(self) -> dict[str, Any] | None:
        """The config the run logged with its metrics (``hparams.yaml``: the composed config,
        the groups chosen, the model's and the data's description, tokens per step)."""
        files = self.metrics_files()
        return _yaml(files[-1].with_name(LOGGED_CONFIG_FILE)) if files else None

    def model_node(self) -> dict[str, Any] | None:
        """The run's ``model`` node: from its logged config, else its composed one."""
        for config in (self.logged_config(), self.config()):
            if config is not None and isinstance(config.get("model"), dict):
                return config["model"]
        return None

    def result(self) -> dict[str, Any] | None:
        """The run's ``result.json`` (how it ended; a finished run's result). A file written before
        results said how the run ended has no ``status``: it is a finished run's, or a diverged
        one's where it names ``diverged_at_step``."""
        path = self.path / RESULT_FILE
        if not path.is_file():
            return None
        result = json.loads(path.read_text())
        result.setdefault("status", DIVERGED if result.get("diverged_at_step") is not None else FINISHED)
        return result

    def holds_a_run(self) -> list[str]:
        """What of an ``mcsd-train`` run this folder holds (checkpoints, model, logs, the result of
        a run that trained): their names, none for a new or empty folder or a refused run's."""
        found = [name for name in (CHECKPOINT_DIR, "model", "csv", "wandb")
                 if (self.path / name).is_dir() and any((self.path / name).iterdir())]
        result = self.result() if (self.path / RESULT_FILE).is_file() else None
        if result is not None and result["status"] != REFUSED:
            found.append(RESULT_FILE)
        return found

    def latest_checkpoint(self) -> Path | None:
        """``checkpoints/last.ckpt`` (a file, or a sharded checkpoint's folder), else the highest
        ``step-*.ckpt``."""
        folder = self.path / CHECKPOINT_DIR
        if (folder / LAST_CHECKPOINT).exists():
            return folder / LAST_CHECKPOINT
        steps = sorted(folder.glob("step-*.ckpt"))
        return steps[-1] if steps else None


def csv_logs(root: str | Path) -> list[tuple[Path, dict[str, Any]]]:
    """``(metrics.csv, logged config)`` of every CSV log under ``root`` that has both (a run
    folder, a sweep's folder of runs, or a folder of sweeps), in path order."""
    logs = []
    for metrics_file in sorted(Path(root).rglob(METRICS_FILE)):
        config = metrics_file.with_name(LOGGED_CONFIG_FILE)
        if config.is_file():
            logs.append((metrics_file, _parse_yaml(config.read_text()) or {}))
    return logs


def run_status(metrics_file: str | Path) -> str | None:
    """How the run whose CSV log ``metrics_file`` is (``<run>/csv/version_*/metrics.csv``) ended: the
    ``status`` of the run folder's ``result.json`` (a sweep's copied logs keep it beside ``csv/``);
    ``None`` where the run wrote none (still running, killed, or logs copied before it was kept)."""
    result = RunFolder(Path(metrics_file).parents[2]).result()
    return None if result is None else result["status"]


def model_node_of(path: str | Path) -> dict[str, Any] | None:
    """The ``model`` node in a YAML file (a run's ``hparams.yaml`` or ``.hydra/config.yaml``, or a
    ``model`` node of its own) or in a run folder; ``None`` where there is none."""
    path = Path(path).expanduser()
    if path.is_dir():
        return RunFolder(path).model_node()
    logged = _yaml(path) or {}
    node = logged.get("model", logged) if isinstance(logged, dict) else None
    return node if isinstance(node, dict) and "_target_" in node else None


def data_files(data: dict[str, Any] | None) -> list[str]:
    """The files of a ``data`` node's ``paths``: one file, a list, or ``{split: file or list}``."""
    files = (data or {}).get("paths") or []
    if isinstance(files, str):
        return [files]
    if isinstance(files, dict):
        return [file for listed in files.values() for file in ([listed] if isinstance(listed, str) else listed or [])]
    return list(files)
