"""The saved-model format, in one place: what a model folder holds, and how a model and its
tokenizer are found in a model folder, an ``mcsd-train`` run directory or any Lightning
checkpoint of a run.

A model folder holds ``model.safetensors`` (the weights), ``config.json`` (the resolved
model config with its ``_target_``) and, when written by ``mcsd-train``, the run's
``tokenizer.json``. A folder that ``mcsd-export`` wrote for Hugging Face ``transformers``
(``config.json`` of ``model_type`` ``mcsd``: the model config under ``mcsd_model``, the weights
under ``model.``) loads the same way, and so does a Hub repository of one (``user/name``,
downloaded with ``huggingface_hub``). A run directory holds its final model folder in ``model/`` and its
checkpoints in ``checkpoints/`` (``step-XXXXXX.ckpt``, ``last.ckpt``); every checkpoint
carries the model config (``hyper_parameters.model``), the weights (``state_dict``, under
``model.``) and the tokenizer (``tokenizer``, as JSON), so an intermediate checkpoint
loads, scores and generates like a final model. A sharded run (``trainer=fsdp``) writes each
checkpoint as a folder of the same name (:mod:`mcsd.checkpoint.sharded`), which loads the same way.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_model
from tokenizers import Tokenizer

from mcsd.checkpoint.lightning_checkpoint import CHECKPOINT_DIR, LAST_CHECKPOINT, WANDB_RUN_KEY, read_checkpoint
from mcsd.checkpoint.sharded import check_sharded_checkpoint, copy_into, is_sharded, is_sharded_checkpoint, read_sharded
from mcsd.errors import MCSDError
from mcsd.files import give_default_permissions, require_readable
from mcsd.models.build import build_model, make_config
from mcsd.models.config import LMConfig
from mcsd.models import registry
from mcsd.models.modeling import CausalLM
from mcsd.models.registry import Architecture

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
TRAINING_FILE = "training.json"  # what a run's model folder records of its training: the sequence length, the W&B run
MODEL_DIR = "model"  # a run's final model folder
CHECKPOINT_TOKENIZER_KEY = "tokenizer"
STATE_DICT_PREFIX = "model."  # the LightningModule's (and the Hugging Face model's) attribute that holds the model
EXPORTED_MODEL_TYPE = "mcsd"  # config.json's model_type in a folder mcsd-export wrote
EXPORTED_CONFIG_KEY = "mcsd_model"  # where such a config.json holds the model config
HUB_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclasses.dataclass(frozen=True)
class SavedModel:
    """A saved model located once: a model ``folder``, an ``exported`` Hugging Face folder or a
    Lightning ``checkpoint`` (a file or a sharded folder). Each of its parts (config, weights,
    tokenizer, trained length, W&B run, architecture and variant) is read from it at most once,
    a checkpoint's file opened once for all of them: give the same ``SavedModel`` to
    :func:`load`, :func:`load_tokenizer`, :func:`trained_seq_len` and the rest."""

    kind: str
    path: Path
    _read: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def name(self) -> str:
        """A short name: the run directory's name (or the folder's / the checkpoint's)."""
        if self.kind == "checkpoint":
            run = self.path.parent.parent if self.path.parent.name == CHECKPOINT_DIR else self.path.parent
            return f"{run.name}/{self.path.stem}"
        return self.path.parent.name if self.path.name == MODEL_DIR else self.path.name

    @property
    def run_directory(self) -> Path | None:
        """The ``mcsd-train`` run directory this model belongs to, if it lies in one."""
        if self.kind == "checkpoint" and self.path.parent.name == CHECKPOINT_DIR:
            return self.path.parent.parent
        if self.kind == "folder" and self.path.name == MODEL_DIR:
            return self.path.parent
        return None

    def _once(self, key: str, read: Callable[[], Any]) -> Any:
        if key not in self._read:
            self._read[key] = read()
        return self._read[key]

    def checkpoint(self) -> dict[str, Any]:
        """A checkpoint's contents (memory-mapped: tensors are read when used), opened once."""
        return self._once("checkpoint", lambda: read_checkpoint(self.path))

    def config(self) -> LMConfig:
        """The resolved model config, without loading the weights."""
        return self._once("config", lambda: _read_config(self))

    @property
    def architecture(self) -> Architecture:
        """The registered architecture the model is."""
        return registry.of_config(self.config())

    @property
    def variant(self) -> str:
        """The name of its architecture's variant it is (:meth:`Architecture.variant_of`)."""
        return self.architecture.variant_of(dataclasses.asdict(self.config()))

    def training(self) -> dict[str, Any]:
        """What the model records of its training: a checkpoint's data settings and W&B run, a
        model folder's ``training.json`` (empty where nothing was recorded: an export, an older folder)."""
        def read() -> dict[str, Any]:
            if self.kind == "checkpoint":
                checkpoint = self.checkpoint()
                data = checkpoint.get("datamodule_hyper_parameters") or {}
                return {"seq_len": data.get("seq_len"), "wandb_run": checkpoint.get(WANDB_RUN_KEY)}
            file = self.path / TRAINING_FILE
            return json.loads(file.read_text()) if file.is_file() else {}
        return self._once("training", read)


def locate(path: str | Path | SavedModel) -> SavedModel:
    """The saved model at ``path``: a model folder, a run directory (its ``model/`` folder,
    else its ``checkpoints/last.ckpt``), a ``.ckpt`` file, a folder ``mcsd-export`` wrote, or
    a Hub repository id of one (downloaded once into the Hugging Face cache); a ``SavedModel``
    is already located (itself)."""
    if isinstance(path, SavedModel):
        return path
    fix = ("point to a model folder (mcsd.save), an mcsd-train run directory or one of its .ckpt files, "
           "an mcsd-export folder or its Hub repository")
    local = Path(path).expanduser()
    # NAME/NAME may be a Hub repository; not where its first part is a folder here (logs/nope: a local path).
    if not local.exists() and HUB_REPO_ID.fullmatch(str(path)) and not local.parent.is_dir():
        path = download_from_hub(str(path), fix)
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: {fix}")
    if path.is_file():
        if path.suffix != ".ckpt":
            raise FileNotFoundError(f"{path} is not a .ckpt file: {fix}")
        return SavedModel("checkpoint", path)
    if is_sharded_checkpoint(path):
        return SavedModel("checkpoint", path)
    for folder in (path, path / MODEL_DIR):
        if (folder / CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file():
            return SavedModel("exported" if _is_exported(folder) else "folder", folder)
    if (path / CHECKPOINT_DIR / LAST_CHECKPOINT).exists():
        return SavedModel("checkpoint", path / CHECKPOINT_DIR / LAST_CHECKPOINT)
    raise FileNotFoundError(f"{path} holds no {CONFIG_FILE} + {WEIGHTS_FILE} nor {CHECKPOINT_DIR}/{LAST_CHECKPOINT}: "
                            f"{fix}")


def _is_exported(folder: Path) -> bool:
    """Whether ``folder``'s config.json is a Hugging Face config of ``model_type`` mcsd."""
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        raise MCSDError(f"{folder / CONFIG_FILE} is not readable JSON: save or export the model again") from None
    return isinstance(config, dict) and config.get("model_type") == EXPORTED_MODEL_TYPE


def download_from_hub(repo_id: str, fix: str) -> Path:
    """The local snapshot of the Hub repository ``repo_id`` (the Hugging Face cache's copy when
    it is there, e.g. offline with ``HF_HUB_OFFLINE=1``)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.py", "*.md"]))
    except HFValidationError:
        raise FileNotFoundError(f"{repo_id} does not exist: {fix}") from None
    except Exception as error:  # huggingface_hub raises network, auth and offline errors of many types
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise FileNotFoundError(f"{repo_id} is not a local path, and as a Hub repository it could not be "
                                f"downloaded ({reason}): {fix}") from None


def save(model: CausalLM, directory: str | Path, tokenizer: Tokenizer | None = None,
         seq_len: int | None = None, wandb_run: str | None = None) -> Path:
    """Write ``model.safetensors``, ``config.json`` (the resolved model config) and, if
    given, ``tokenizer.json`` and ``training.json`` (the sequence length it was trained on, and the
    W&B run its training logged to) to ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_model(model, str(directory / WEIGHTS_FILE))
    give_default_permissions(directory / WEIGHTS_FILE)  # safetensors writes it 0600
    (directory / CONFIG_FILE).write_text(json.dumps(model.config.to_portable_dict(), indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(str(directory / TOKENIZER_FILE))
    training = {key: value for key, value in (("seq_len", seq_len), ("wandb_run", wandb_run)) if value is not None}
    if training:
        (directory / TRAINING_FILE).write_text(json.dumps(training, indent=2) + "\n")
    return directory


def trained_seq_len(path: str | Path | SavedModel) -> int | None:
    """The sequence length the model at ``path`` was trained on (:meth:`SavedModel.training`);
    ``None`` where it was not recorded (an export, an older folder)."""
    value = locate(path).training().get("seq_len")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def trained_wandb_run(path: str | Path | SavedModel) -> str | None:
    """The W&B run id of the training that made the model at ``path`` (:meth:`SavedModel.training`);
    ``None`` where none was recorded (no W&B, an export, an older folder)."""
    value = locate(path).training().get("wandb_run")
    return value if isinstance(value, str) else None


def whole_model(config: LMConfig, weights: dict[str, torch.Tensor]) -> CausalLM:
    """The model of ``config`` holding ``weights`` (a full state dict, e.g. gathered from a
    sharded model) as its parameters, without a copy (an empty model filled, never initialised)."""
    with torch.device("meta"):
        model = build_model(config)
    if config.tie_embeddings:  # a file holds a tied weight once, under either name
        tied = weights.get("embed.weight", weights.get("lm_head.weight"))
        weights = {**weights, "embed.weight": tied, "lm_head.weight": tied}
    model.load_state_dict(weights, assign=True)
    model.tie_weights()  # assigned one by one, tied parameters come apart
    return model


def _read_config(saved: SavedModel) -> LMConfig:
    if saved.kind == "folder":
        return make_config(json.loads((saved.path / CONFIG_FILE).read_text()))
    if saved.kind == "exported":
        config = json.loads((saved.path / CONFIG_FILE).read_text()).get(EXPORTED_CONFIG_KEY)
        if config is None:
            raise MCSDError(f"{saved.path / CONFIG_FILE} has no {EXPORTED_CONFIG_KEY}: export the model again "
                            "with mcsd-export")
        return make_config(config)
    return make_config(saved.checkpoint()["hyper_parameters"]["model"])


def load(path: str | Path | SavedModel, device: str | torch.device = "cpu",
         dtype: torch.dtype = torch.float32) -> CausalLM:
    """Load the model at ``path`` (see :func:`locate`) onto ``device`` in ``dtype``, in eval mode:
    the weights are read straight into an empty model (built on the meta device, never initialised)."""
    saved = locate(path)
    # A checkpoint's tensors are mapped from its file: copied, so that the model outlives the file.
    copy = saved.kind == "checkpoint"
    weights = {name: value.to(device=device, dtype=dtype, copy=copy) for name, value in read_weights(saved).items()}
    return whole_model(saved.config(), weights).eval()


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file; one that is not whole (truncated) or not one at all
    is named in one line."""
    require_readable(path)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise MCSDError(f"{path} is not a readable safetensors file (truncated, or not one: {reason}): save or "
                        "export the model again, or use another") from None


def read_weights(saved: SavedModel) -> dict[str, torch.Tensor]:
    """The model weights of a saved model, by parameter name."""
    if saved.kind == "folder":
        return read_safetensors(saved.path / WEIGHTS_FILE)
    if saved.kind == "exported":  # the Hugging Face model's weights, under model., less tied copies
        weights = {key.removeprefix(STATE_DICT_PREFIX): value
                   for key, value in read_safetensors(saved.path / WEIGHTS_FILE).items()}
        if saved.config().tie_embeddings:
            weights.setdefault("lm_head.weight", weights["embed.weight"])
        return weights
    if saved.path.is_dir():
        check_sharded_checkpoint(saved.path)
        state_dict = read_sharded(saved.path, {"state_dict"})["state_dict"]
    else:
        state_dict = saved.checkpoint()["state_dict"]
    return {key.removeprefix(STATE_DICT_PREFIX): value for key, value in state_dict.items()
            if key.startswith(STATE_DICT_PREFIX)}


def load_weights(model: CausalLM, path: str | Path | SavedModel) -> None:
    """Start ``model`` from the weights saved at ``path`` (fine-tuning, ``init_from``): every saved
    weight must fit it; only what the model adds in merging streams (RWKV-4's W_agg) may be
    missing, and keeps its initialisation (a saved mix with one perspective fills every one).
    A sharded model (FSDP2) takes its shard of each weight: the weights are first loaded into a
    twin on the meta device, so that the modules' own load hooks convert them as usual."""
    saved = locate(path)
    fix = "start from a model of the same architecture and size"
    sharded = is_sharded(model)
    if sharded:
        with torch.device("meta"):
            target = build_model(model.config)
    else:
        target = model
    try:
        missing, unexpected = target.load_state_dict(read_weights(saved), strict=False, assign=sharded)
    except RuntimeError as error:
        detail = next((line.strip() for line in str(error).splitlines() if "size mismatch" in line), str(error))
        raise MCSDError(f"init_from={path}: its weights do not fit this model ({detail}): {fix}") from None
    missing = [key for key in missing if not key.startswith("streams.")]
    if missing or unexpected:
        which = f"this model's {missing[0]} is not saved there" if missing else f"it holds {unexpected[0]}, unknown here"
        raise MCSDError(f"init_from={path}: {which}: {fix}")
    if sharded:
        own = model.state_dict(keep_vars=True)
        for name, value in target.state_dict(keep_vars=True).items():
            if not value.is_meta:
                copy_into(own[name], value)


def load_tokenizer(path: str | Path | SavedModel) -> Tokenizer:
    """The tokenizer saved with the model at ``path`` (``tokenizer.json`` or the checkpoint's)."""
    saved = locate(path)
    if saved.kind == "checkpoint":
        text = saved.checkpoint().get(CHECKPOINT_TOKENIZER_KEY)
        if text is None:
            raise FileNotFoundError(f"{saved.path} carries no tokenizer: it was saved without one")
        return Tokenizer.from_str(text)
    file = saved.path / TOKENIZER_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist: this model was saved without its tokenizer")
    return Tokenizer.from_file(str(file))
