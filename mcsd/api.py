"""Build a model from its config, and count its parameters without memory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig

from mcsd.models import CausalLM, LMConfig, make_config
from mcsd.models import registry


def build_model(model_cfg: Mapping[str, Any] | DictConfig | LMConfig) -> CausalLM:
    """Build the model that a composed ``model`` node (DictConfig or dict) describes.

    Raises :class:`mcsd.ConfigError` with one line naming the field when it cannot work.
    """
    config = make_config(model_cfg)
    return registry.of_config(config).model_class(config)


def count_parameters(model_cfg: Mapping[str, Any] | DictConfig | LMConfig) -> int:
    """Parameters of the model ``model_cfg`` describes, built on the meta device (no memory),
    so that the paper's 10B configuration can be counted anywhere. Tied weights count once."""
    with torch.device("meta"):
        model = build_model(model_cfg)
    return sum(parameter.numel() for parameter in model.parameters())
