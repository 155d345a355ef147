"""Build a model from its config, and count its parameters without memory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig

from mcsd.models import CausalLM, LMConfig, make_config
from mcsd.models import registry


def build_model(
    model_cfg: Mapping[str, Any] | DictConfig | LMConfig, device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> CausalLM:
    """Build the model that a composed ``model`` node (DictConfig or dict) describes, on ``device``
    (the default device, e.g. the CPU, unless given) in ``dtype`` (fp32 unless given).

    The modules are made on the meta device (no memory, no values), then the parameters are
    allocated once on ``device`` in ``dtype`` and initialised there, once
    (:meth:`CausalLM.reset_parameters`): no constructor's own initialisation that the model's
    overwrites, no fp32 copy of a 16-bit model. The values depend on the seed, the device and the
    dtype. Built under ``torch.device("meta")`` (and no ``device``), the model stays on the meta device.

    Raises :class:`mcsd.ConfigError` with one line naming the field when it cannot work.
    """
    config = make_config(model_cfg)
    target = torch.device(device) if device is not None else torch.get_default_device()
    with torch.device("meta"):
        model = registry.of_config(config).model_class(config)
    if dtype is not None:
        model.to(dtype=dtype)
    if target.type != "meta":
        model.to_empty(device=target)
        model.tie_weights()  # to_empty makes each parameter anew, tied ones apart
        model.reset_parameters()
    return model


def count_parameters(model_cfg: Mapping[str, Any] | DictConfig | LMConfig) -> int:
    """Parameters of the model ``model_cfg`` describes, built on the meta device (no memory),
    so that the paper's 10B configuration can be counted anywhere. Tied weights count once."""
    with torch.device("meta"):
        model = build_model(model_cfg)
    return sum(parameter.numel() for parameter in model.parameters())
