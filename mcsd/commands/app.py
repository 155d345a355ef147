"""What the command-line apps share: config resolvers, the arms sweeper, the bad-input rules
(one line on stderr, exit status 2, no run folder left behind) and a sweep's jobs that do not
finish (each says why in its folder; the sweep goes on: :mod:`mcsd.training.sweep`)."""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.resources
import inspect
import itertools
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import hydra
import yaml
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.errors import InstantiationException
from omegaconf import DictConfig, ListConfig, OmegaConf

from mcsd.errors import MCSDError
from mcsd.runtime import apply_flush_denormal, apply_threads, interrupted

Result = TypeVar("Result")

# Third-party warnings that say nothing about the user's settings, each matched by its text.
THIRD_PARTY_WARNINGS = (
    r"'set_vital' is deprecated",  # torchdata's StatefulDataLoader calls a deprecated torch function
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning's pytree helper on torch 2.13
    r"`torch.jit.script_method` is deprecated",  # a dependency of lm-eval, at import
    r"The dirpath has changed from",  # Lightning's ModelCheckpoint on every resume: a resumed run has a folder of its own
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


def command_help(config_name: str) -> str:
    """``--help`` of a command (``hydra.help.template``): what its primary config's leading comment
    says, the groups a user chooses from with their options and default, and the main settings
    with their defaults and comments (instead of Hydra's default, which lists internal groups)."""
    conf = importlib.resources.files("mcsd.conf")
    text = (conf / f"{config_name}.yaml").read_text()
    lines = text.splitlines()
    header = [line[2:] for line in itertools.takewhile(lambda line: line.startswith("#"), lines)]
    defaults = (yaml.safe_load(text) or {}).get("defaults", [])
    groups = []
    for entry in defaults:
        if not isinstance(entry, dict):
            continue
        (group, default), = entry.items()
        group = group.removeprefix("override ")
        if group in ("paths", "hydra") or group.startswith("hydra/"):
            continue
        folder = conf / group
        files = [path.name for path in folder.iterdir()] if folder.is_dir() else []
        stored = list(ConfigStore.instance().repo.get(group, {}))  # the registry's nodes (commands/config_nodes.py)
        options = sorted({name.removesuffix(".yaml") for name in files + stored
                          if name.endswith(".yaml") and not name.startswith("_")})
        if options:
            groups.append(f"  {group}={'|'.join(options)}  (default: {'none' if default is None else default})")
    settings = []
    for line in lines:
        match = re.match(r"^([a-z_]+): ?([^#]*?)\s*(?:#\s*(.*))?$", line)
        if match and match.group(1) not in ("defaults", "hydra", "task_name") and match.group(2) not in ("", "|"):
            name, value, comment = match.groups()
            settings.append(f"  {name}={value}" + (f"  ({comment})" if comment else ""))
    parts = ["\n".join(header)]
    if groups:
        parts.append("Groups (group=option):\n" + "\n".join(groups))
    if settings:
        parts.append("Settings (key=value, a nested one as key.sub=value; --cfg job prints them all):\n"
                     + "\n".join(settings))
    parts.append("Sweeps: -m with comma-separated values (-m model=mcsd,transformer seed=0,1); docs/configs.md has the rest.")
    return "\n\n".join(parts).replace("$", "$$")  # Hydra fills the template with string.Template


# ${mcsd.help:CONFIG_NAME}: --help of the command whose primary config is CONFIG_NAME.
OmegaConf.register_new_resolver("mcsd.help", command_help, replace=True)


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


class Refusal(SystemExit):
    """How :func:`fail` ends an app (exit status 2), keeping its message: a sweep's job that
    refused its settings records why, for the sweep's summary."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message


def fail(app: str, message: str) -> NoReturn:
    """End the app with one line on stderr (a line for each problem, when ``message`` lists
    several) and exit status 2."""
    for line in message.splitlines() or [message]:
        print(f"{app}: error: {line}", file=sys.stderr, flush=True)
    raise Refusal(message)


def _own_error(error: BaseException | None) -> BaseException | None:
    """The project's error (or a missing file) behind ``error``: Hydra wraps what a config
    object raises while it is instantiated, sometimes twice."""
    while error is not None:
        if isinstance(error, (MCSDError, FileNotFoundError)):
            return error
        error = error.__cause__ or error.__context__
    return None


def run_or_exit(app: str, function: Callable[[], Result]) -> Result:
    """Run ``function``; a setting or file that cannot work ends the app with one line on
    stderr and exit status 2 instead of a traceback, and Ctrl-C with one line and status 130."""
    try:
        return function()
    except KeyboardInterrupt:
        interrupted(app, "nothing was finished")
    except (MCSDError, FileNotFoundError) as error:
        fail(app, str(error))
    except PermissionError as error:  # a file or folder this user may not read or write
        fail(app, f"{error.filename or 'a file'} cannot be used: {error.strerror or error} (this user's rights): "
                  "change its permissions (chmod) or use another")
    except InstantiationException as error:  # a config object that refused its settings
        own = _own_error(error)
        if own is None:
            raise
        fail(app, str(own))


def refuse_onnx_export(app: str, ckpt: str, how: str) -> None:
    """A command that reads a PyTorch model given an ONNX export (``mcsd-export format=onnx``): one
    line saying what the folder is and ``how`` to use it, not that it holds no model."""
    from mcsd.deploy.onnx_runner import is_onnx_export

    if is_onnx_export(Path(ckpt).expanduser()):
        raise MCSDError(f"ckpt={ckpt} is an ONNX export (mcsd-export format=onnx), which {app} does not read: {how}")


def require_values(cfg: DictConfig) -> None:
    """Every ``???`` of the config has been given a value, and a ``seed`` is a whole number."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise MCSDError(f"{missing[0]} is missing: give it on the command line ({missing[0]}=...)")
    seed = cfg.get("seed") if "seed" in cfg else 0
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise MCSDError(f"seed={seed} must be a whole number (e.g. seed=0; a sweep: -m seed=0,1,2)")


_INSTANTIATE_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


def check_settings_exist(node: Any, path: str = "") -> None:
    """Refuse a setting that the class or function a config node instantiates does not take (e.g.
    ``+trainer.max_step=5``, which Hydra suggests for the typo ``trainer.max_step``), naming the
    nearest setting it does take, instead of the TypeError it would end in once the run has begun."""
    if isinstance(node, ListConfig):
        for index, item in enumerate(node):
            check_settings_exist(item, f"{path}[{index}]")
        return
    if not isinstance(node, DictConfig):
        return
    target = node.get("_target_") if "_target_" in node else None
    if isinstance(target, str):
        from hydra.utils import get_object

        try:
            function = get_object(target)
            parameters = inspect.signature(function).parameters.values()
        except (ImportError, AttributeError, ValueError, TypeError):
            parameters = None  # what cannot be looked at here fails as it would have
        if parameters is not None and not any(p.kind is p.VAR_KEYWORD for p in parameters):
            taken = {p.name for p in parameters if p.kind is not p.VAR_POSITIONAL}
            for key in node:
                if key not in taken and key not in _INSTANTIATE_KEYS:
                    close = difflib.get_close_matches(str(key), sorted(taken), n=1)
                    hint = f"did you mean {path}.{close[0]}?" if close else f"drop it (it takes {', '.join(sorted(taken))})"
                    raise MCSDError(f"{path}.{key} is not a setting of {target}: {hint}")
    for key in node:  # not the model node: the registry names a setting of another architecture itself
        if key not in _INSTANTIATE_KEYS and not (path == "" and key == "model"):
            check_settings_exist(node._get_node(key), f"{path}.{key}" if path else str(key))


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


def check_overrides_parse(app: str, argv: list[str]) -> None:
    """Refuse, in one line with the fix, a ``key=value`` that Hydra's override grammar cannot read
    (Hydra would end in a ``LexerNoViableAltException``): a ``~`` (a home folder) or another
    character the grammar keeps for itself outside quotes."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for argument in argv:
        if argument.startswith("-") or "=" not in argument:
            continue
        try:
            parser.parse_override(argument)
        except Exception as error:  # noqa: BLE001  Hydra raises its own parse exceptions (and ANTLR's)
            key, _, value = argument.partition("=")
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            items = value[1:-1].split(",") if value.startswith("[") and value.endswith("]") else None
            quoted = ("[" + ",".join(f'"{item.strip()}"' for item in items) + "]") if items is not None else f'"{value}"'
            fix = f"quote it: '{key}={quoted}'"
            if "~" in value:
                fix = f"Hydra reads ~ only inside quotes: write '{key}={quoted}', or the full path ({Path.home()}/...)"
            fail(app, f"{argument} cannot be read as a setting ({reason}): {fix}")


def _top_level_names(config_name: str) -> set[str]:
    """The top-level settings and config groups of a command's primary config."""
    text = (importlib.resources.files("mcsd.conf") / f"{config_name}.yaml").read_text()
    known = set(yaml.safe_load(text) or {})
    for entry in (yaml.safe_load(text) or {}).get("defaults", []):
        if isinstance(entry, dict):
            known |= {str(group).removeprefix("override ") for group in entry}
    return known - {"defaults", "hydra"}


def check_new_top_level_keys(app: str, config_name: str, argv: list[str]) -> None:
    """Refuse ``+key=value`` of a top-level key the command has no setting or group of (Hydra's
    own suggestion for a typo, ``+sed=5`` for ``sed=5``, would be accepted and ignored), naming
    the nearest one it has."""
    known = _top_level_names(config_name)
    for argument in argv:
        key, equals, value = argument.partition("=")
        if not equals or not key.startswith("+") or key.startswith("++"):
            continue
        name = key.lstrip("+")
        if "." in name or "/" in name or name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"did you mean {close[0]}={value}?" if close else f"{app} --help lists its settings"
        fail(app, f"{argument}: {name} is not a setting of {app}, so it would be ignored: {hint}")


def key_of(override: str) -> str:
    """The key a ``key=value`` override sets (``+``, ``++`` and ``~`` dropped)."""
    return override.split("=", 1)[0].lstrip("+~")


def _first_values(argv: list[str]) -> list[str]:
    """The ``key=value`` overrides of ``argv``, a sweep's by its first value (what its first job composes)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    overrides = []
    for argument in argv:
        if argument.startswith("-") or "=" not in argument:
            continue
        override = parser.parse_override(argument)
        if override.is_sweep_override():
            first = next(iter(override.sweep_string_iterator()), None)
            argument = f"{argument.split('=', 1)[0]}={first}"
        overrides.append(argument)
    return overrides


def _check_task_has_its_data(app: str, cfg: DictConfig, overrides: list[str]) -> None:
    """``task=NAME`` (a task of MAD or of retrieval) with a text corpus for data: one line naming the
    data option the task belongs to, instead of the corpus's list of settings that lack ``task``."""
    chosen = next((override.split("=", 1)[1] for override in overrides if key_of(override) == "task"), None)
    data = cfg.get("data")
    if (chosen in (None, "null") or not isinstance(data, DictConfig)
            or str(data.get("_target_")).endswith("TaskDataModule")):
        return
    from mcsd.data.mad import MAD_TASKS

    source = "mad" if chosen in MAD_TASKS else "retrieval"
    fail(app, f"task={chosen} is a task of data={source}, and this run's data is a text corpus: add data={source} "
              f"(or experiment={source}: every architecture on every task)")


def check_keys_exist(app: str, config_name: str, argv: list[str]) -> None:
    """Refuse, in one line with the nearest setting there is, an override of a key the composed
    config does not have (``trainer.max_stepz=5``, ``modle=transformer``, a dict of keys a
    settings node lacks), where Hydra would print several lines whose advice (``+key=...``)
    adds a key that nothing reads."""
    from hydra import compose, initialize_config_module
    from hydra.errors import ConfigCompositionException

    overrides = _first_values(argv)
    try:
        with initialize_config_module("mcsd.conf", version_base="1.3"):
            cfg = compose(config_name, overrides=overrides)
        _check_task_has_its_data(app, cfg, overrides)
        return
    except ConfigCompositionException as error:
        cause = str(error.__cause__ or "")
        missing = re.search(r"full_key: (\S+)", cause)
        if "is not in struct" not in cause or missing is None:
            return  # Hydra's own message says what else is wrong
        full_key = missing.group(1)
    except Exception:  # noqa: BLE001  anything else is Hydra's to report, as it would have
        return
    holders = _models_holding(config_name, overrides) if full_key.startswith("model.") else []
    argument = next((override for override in overrides if key_of(override) == full_key), None) or next(
        (override for override in overrides if full_key.startswith(key_of(override) + ".")
         and override.split("=", 1)[1].startswith("{")), None)
    if argument is None:
        return
    key, value = argument.split("=", 1)
    if holders and {"-m", "--multirun"} & set(argv):  # a setting of the architecture a sweep's arm chooses
        fail(app, f"{argument}: {key.split('.', 1)[1]} is a setting of {', '.join(holders)}, not of the model the sweep "
                  f"composes first: give it to those arms alone, \"+hydra.sweeper.registry_settings.{holders[0]}="
                  f"['{argument}']\" (or ++{argument} to every arm)")
    others = [override for override in overrides if override != argument]
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        cfg = compose(config_name, overrides=others)
    if full_key != key:  # a dict value with keys its node lacks
        node = OmegaConf.select(cfg, key)
        held = ", ".join(str(name) for name in node) if isinstance(node, DictConfig) and len(node) else "nothing"
        name = full_key[len(key) + 1:].split(".")[0]
        fail(app, f"{argument}: {key} has no key {name} (it holds {held}): set each key as its own setting, "
                  f"{key}.KEY=VALUE, and add a key it lacks with a +: +{key}.{name}=...")
    parent, _, name = key.rpartition(".")
    if parent:
        node = OmegaConf.select(cfg, parent)
        names = sorted(str(item) for item in node if not str(item).startswith("_")) if isinstance(node, DictConfig) \
            else []
    else:
        names = sorted(_top_level_names(config_name))
    close = difflib.get_close_matches(name, names, n=1)
    chosen = next((override for override in others if key_of(override) == parent), None)  # data=mqar: its option's
    where = f"a setting of {chosen or parent}" if parent else f"a setting or group of {app}"
    hint = (f"did you mean {parent + '.' if parent else ''}{close[0]}={value}?" if close else
            f"{app} --help lists its settings ({parent} holds {', '.join(names) or 'nothing'})" if parent else
            f"{app} --help lists its settings and groups")
    fail(app, f"{argument}: {name} is not {where}: {hint}")


def _models_holding(config_name: str, overrides: list[str]) -> list[str]:
    """The registered architectures whose model node takes the ``model.`` overrides (what a sweep's
    arm may choose, where the default model lacks a key)."""
    from hydra import compose, initialize_config_module

    from mcsd.models import registry

    others = [override for override in overrides if key_of(override) != "model"]
    holders = []
    for name in registry.architectures():
        try:
            with initialize_config_module("mcsd.conf", version_base="1.3"):
                compose(config_name, overrides=[*others, f"model={name}"])
            holders.append(name)
        except Exception:  # noqa: BLE001  this architecture lacks the key
            continue
    return holders


def check_command_line(app: str, config_name: str, argv: list[str]) -> None:
    """Refuse, in one line and before Hydra makes a run folder, a setting Hydra cannot read, a
    new top-level key the command does not read, a group option that does not exist and a
    launcher that cannot start here."""
    check_overrides_parse(app, argv)
    check_new_top_level_keys(app, config_name, argv)
    for group, value, options in _group_options(config_name, argv):
        for choice in value.split(","):
            if choice not in options and choice != "null":
                fail(app, f"{group}={choice} is not an option of {group}: use one of {', '.join(options)}")
            if group == "hydra/launcher" and "slurm" in choice and shutil.which("sbatch") is None:
                fail(app, f"hydra/launcher={choice} submits to SLURM, but there is no sbatch here: run on a SLURM "
                          "login node, or use hydra/launcher=local_parallel (or basic)")
    check_keys_exist(app, config_name, argv)


# The command-line settings that name folders a command writes into (hydra.run.dir and
# hydra.sweep.dir default to folders under paths.log_dir, ./logs unless given).
_FOLDER_SETTINGS = ("paths.log_dir", "paths.cache_dir", "paths.output_dir", "output_dir", "hydra.run.dir",
                    "hydra.sweep.dir", "out")


def unwritable(folder: Path) -> str | None:
    """Why files cannot be written into ``folder`` (made if missing), or None: a file in the way,
    or what the system says when its nearest existing parent refuses a file (a read-only file
    system, no permission)."""
    existing = folder.expanduser().absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        return f"{error.strerror or error} ({existing})"
    return None


def check_folders(app: str, config_name: str, argv: list[str]) -> None:
    """Refuse, in one line and before Hydra makes its run folder, a folder the command would
    write into that cannot be written: ``paths.log_dir`` (``logs`` unless given) and any other
    folder setting given on the command line."""
    given = {}
    for argument in argv:
        key, equals, value = argument.lstrip("+~").partition("=")
        if equals and key in _FOLDER_SETTINGS and value and "${" not in value:
            given[key] = value
    if config_name != "export":  # mcsd-export writes out= alone (its Hydra folder is the current one)
        given.setdefault("paths.log_dir", "logs")
    for key, value in given.items():
        reason = unwritable(Path(value))
        if reason is not None:
            fail(app, f"{key}={value} is not writable: {reason}; choose a folder this user can write to")


def _log_dir(config_name: str, argv: list[str]) -> Path | None:
    """The ``paths.log_dir`` a command writes under (``logs`` unless given; none for mcsd-export,
    which writes ``out=`` alone), as typed on the command line."""
    if config_name == "export":
        return None
    given = [argument.lstrip("+~").partition("=")[2] for argument in argv
             if argument.lstrip("+~").startswith("paths.log_dir=")]
    value = given[-1] if given else "logs"
    return None if "${" in value or "," in value else Path(value).expanduser()


def _remove_empty_run_dir(cfg: DictConfig) -> None:
    """A run that failed before writing anything leaves no folder (Hydra's own ``.hydra/`` and
    log file do not count), nor the empty folders Hydra made above it under ``paths.log_dir``
    (``logs/eval/runs``, ``logs/train/multiruns``). The working folder is never removed."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return
    run_dir = Path(HydraConfig.get().runtime.output_dir).absolute()
    if run_dir == Path.cwd() or run_dir in Path.cwd().parents:
        return  # a command that writes where it runs (mcsd-export)
    hydra_log = f"{HydraConfig.get().job.name}.log"  # what Hydra itself writes there, with .hydra/
    written = [path for path in run_dir.rglob("*") if path.is_file()
               and ".hydra" not in path.relative_to(run_dir).parts and path.relative_to(run_dir) != Path(hydra_log)]
    if not run_dir.is_dir() or written:
        return  # a folder holding anything else (a user's files: hydra.run.dir=THEIR_FOLDER) is left whole
    shutil.rmtree(run_dir)
    # A sweep whose jobs all failed so leaves no folder either (Hydra's multirun.yaml does not count).
    sweep_dir = run_dir.parent
    if (HydraConfig.get().mode == RunMode.MULTIRUN and sweep_dir.is_dir()
            and {entry.name for entry in sweep_dir.iterdir()} <= {"multirun.yaml"}):
        shutil.rmtree(sweep_dir)
    log_dir = OmegaConf.select(cfg, "paths.log_dir", default=None)
    if log_dir is None:
        return
    log_dir = Path(log_dir).absolute()
    folder = run_dir.parent if run_dir.parent.is_dir() else sweep_dir.parent
    while log_dir in folder.parents and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


def _in_sweep() -> bool:
    """Whether this task is a job of a ``-m`` sweep."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _job_finished() -> None:
    """A sweep's job that finished says so in its ``result.json`` (``mcsd-train`` writes its own,
    with its result; another command's job, only how it ended)."""
    from hydra.core.hydra_config import HydraConfig

    from mcsd.checkpoint.run_folder import FINISHED, RunFolder, write_result

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if RunFolder(run_dir).result() is None:
        write_result(run_dir, {"status": FINISHED})


def _end_job(app: str, cfg: DictConfig, ended: BaseException) -> None:
    """A sweep's job that did not finish (refused, diverged, interrupted, or an error of ours):
    its folder's ``result.json`` says how it ended (a diverged run has written its own), and the
    sweep goes on with the next job, in this process or beside it, instead of ending with it. An
    interrupted job (Ctrl-C, SIGTERM) stops the sweep: its summary is printed and the command ends."""
    from hydra.core.hydra_config import HydraConfig

    from mcsd.checkpoint.run_folder import DIVERGED, FAILED, INTERRUPTED, REFUSED, RunFolder, write_result
    from mcsd.training.sweep import end_sweep

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    code = ended.code if isinstance(ended, SystemExit) else 1
    if isinstance(ended, Refusal):
        status, reason = REFUSED, ended.message
    elif isinstance(code, int) and code - 128 in signal.valid_signals():
        status, reason = INTERRUPTED, f"stopped by {signal.Signals(code - 128).name} (exit status {code})"
    elif isinstance(ended, SystemExit):
        status, reason = FAILED, f"exit status {code}"
    else:
        status, reason = FAILED, f"{type(ended).__name__}: {ended} (the traceback is in this job's output)"
    earlier = RunFolder(run_dir).result()
    if earlier is None or not (earlier["status"] == DIVERGED and status == REFUSED):  # divergence: the run's own
        write_result(run_dir, {"status": status, "reason": reason})
    if status == INTERRUPTED:
        sweep = HydraConfig.get().sweep
        print(f"{app}: the sweep stops at its interrupted job {HydraConfig.get().job.num}: the jobs after it do not start",
              file=sys.stderr, flush=True)
        end_sweep(Path(sweep.dir).absolute(), cfg.get("task_name", ""), OmegaConf.select(cfg, "paths.log_dir"))
        raise ended


def hydra_app(app: str, config_name: str) -> Callable[[Callable[[DictConfig], Result]], Callable[[], Result]]:
    """``@hydra.main`` on ``conf/<config_name>.yaml`` (the package ``mcsd.conf``), with this project's bad-input rules: a
    bad group option or launcher, or a folder it cannot write, is refused before Hydra starts, a missing value or a
    setting that cannot work ends the app in one line (exit status 2), and a run that
    failed before writing anything leaves no run folder."""

    def decorate(task: Callable[[DictConfig], Result]) -> Callable[[], Result]:
        @functools.wraps(task)
        def checked_task(cfg: DictConfig) -> Result | None:
            try:
                result = run_or_exit(app, lambda: (require_values(cfg), check_settings_exist(cfg), apply_threads(app, cfg),
                                                   apply_flush_denormal(app, cfg), task(cfg))[4])
                if _in_sweep():
                    _job_finished()
                return result
            except SystemExit as ended:
                if ended.code in (0, None) or not _in_sweep():
                    _remove_empty_run_dir(cfg)
                    raise
                _end_job(app, cfg, ended)
            except Exception as error:  # noqa: BLE001  a sweep's job: said with its traceback, the sweep goes on
                if not _in_sweep():
                    raise
                traceback.print_exc()
                _end_job(app, cfg, error)
            return None

        hydra_main = hydra.main(version_base="1.3", config_path="pkg://mcsd.conf", config_name=config_name)(
            checked_task)

        @functools.wraps(task)
        def entry() -> Result:
            check_command_line(app, config_name, sys.argv[1:])
            check_folders(app, config_name, sys.argv[1:])
            log_dir = _log_dir(config_name, sys.argv[1:])
            made_here = log_dir is not None and not log_dir.exists()
            try:
                return hydra_main()
            finally:  # a refused command in a fresh folder leaves no empty logs/ behind
                if made_here and log_dir.is_dir() and not any(path.is_file() for path in log_dir.rglob("*")):
                    shutil.rmtree(log_dir, ignore_errors=True)

        return entry

    return decorate
