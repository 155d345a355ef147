"""The public entry points: build, count, save and load models."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from safetensors.torch import load_model, save_model
from tokenizers import Tokenizer

from mcsd.models import MODEL_CLASSES, CausalLM, LMConfig, make_config

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"


def build_model(model_cfg: Mapping[str, Any] | DictConfig | LMConfig) -> CausalLM:
    """Build the model that a composed ``model`` node (DictConfig or dict) describes.

    Raises :class:`mcsd.ConfigError` with one line naming the field when it cannot work.
    """
    config = make_config(model_cfg)
    return MODEL_CLASSES[type(config)](config)


def count_parameters(model_cfg: Mapping[str, Any] | DictConfig | LMConfig) -> int:
    """Parameters of the model ``model_cfg`` describes, built on the meta device (no memory),
    so that the paper's 10B configuration can be counted anywhere. Tied weights count once."""
    with torch.device("meta"):
        model = build_model(model_cfg)
    return sum(parameter.numel() for parameter in model.parameters())


def save(model: CausalLM, directory: str | Path) -> Path:
    """Write ``model.safetensors`` and ``config.json`` (the resolved model config) to ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_model(model, str(directory / WEIGHTS_FILE))
    (directory / CONFIG_FILE).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
    return directory


def model_dir(path: str | Path) -> Path:
    """The saved-model folder for ``path``: the folder itself, or ``<run dir>/model`` of an
    ``mcsd-train`` run."""
    path = Path(path).expanduser()
    if (path / "model" / CONFIG_FILE).is_file():
        return path / "model"
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():
            raise FileNotFoundError(
                f"{path / name} does not exist: point to a folder written by mcsd.save or an mcsd-train run directory"
            )
    return path


def load(path: str | Path, device: str | torch.device = "cpu") -> CausalLM:
    """Load a model written by :func:`save` (or the one an ``mcsd-train`` run saved), in eval mode."""
    directory = model_dir(path)
    model = build_model(json.loads((directory / CONFIG_FILE).read_text()))
    load_model(model, str(directory / WEIGHTS_FILE), device=str(device))
    return model.to(device).eval()


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer saved beside a model (``tokenizer.json``) by ``mcsd-train``."""
    file = model_dir(path) / TOKENIZER_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist: this model was saved without its tokenizer")
    return Tokenizer.from_file(str(file))
