"""Building from a config: a composed ``model`` node turned into a validated config (equal-size
widths resolved), and a config into a model or its parameter count.

It sits above the registry (it looks architectures up by name and by config class) and below
everything that builds a model; ``mcsd.build_model`` and ``mcsd.count_parameters`` are these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from mcsd.models import registry
from mcsd.models.config import SKELETON_FIELDS, ConfigError, LMConfig, class_path
from mcsd.models.modeling import CausalLM

MLP_WIDTH_MULTIPLE = 8  # widths chosen for equal size are multiples of this


def make_config(model_cfg: Mapping[str, Any] | DictConfig | LMConfig) -> LMConfig:
    """Turn a composed ``model`` node (DictConfig or dict) into a validated, resolved config."""
    if isinstance(model_cfg, LMConfig):
        return _equal_size(model_cfg)
    if isinstance(model_cfg, DictConfig):
        values = OmegaConf.to_container(model_cfg, resolve=True)
    else:
        values = dict(model_cfg)
    target = values.pop("_target_", None)
    architecture = registry.of_target(target)
    if architecture is None:
        known = ", ".join(class_path(registry.get(name).config_class) for name in registry.architectures())
        raise ConfigError(f"model._target_={target!r} is not a model config: use one of {known}")
    cls = architecture.config_class
    fields = {field.name for field in dataclasses.fields(cls)}
    for key in values:
        if key in fields:
            continue
        owners = [name for name in registry.architectures()
                  if key in {field.name for field in dataclasses.fields(registry.get(name).config_class)}]
        if owners:
            raise ConfigError(
                f"model.{key} is a setting of {' and '.join(owners)}, not of {architecture.name}: "
                f"drop the override (an ablation=... is MCSD's) or use model={owners[0]}"
            )
        raise ConfigError(f"model.{key} is not a {architecture.name} setting: remove it "
                          f"(known: {', '.join(sorted(fields))})")
    missing = [field.name for field in dataclasses.fields(cls) if field.name not in values
               and field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"model.{missing[0]} is missing: set it, e.g. with a size=... config")
    return _equal_size(cls(**values))


def _equal_size(config: LMConfig) -> LMConfig:
    """Resolve ``equal_params_to``: the MLP width that brings the parameter count closest to
    the named architecture's at the same skeleton (parameters are affine in the width, so
    two counts on the meta device give the line). Fields marked ``sized_at`` take that value
    for the count (a switch that adds its own parameters to a model of the same width)."""
    if config.equal_params_to is None:
        return config
    reference = registry.get(config.equal_params_to).config_class(
        **{name: getattr(config, name) for name in SKELETON_FIELDS})
    target = count_parameters(reference)
    step = MLP_WIDTH_MULTIPLE
    sized = {field.name: field.metadata["sized_at"] for field in dataclasses.fields(config) if "sized_at" in field.metadata}
    low, high = (count_parameters(dataclasses.replace(config, mlp_hidden_size=width, equal_params_to=None, **sized))
                 for width in (step, 2 * step))
    if high == low:
        raise ConfigError(f"model.equal_params_to={config.equal_params_to}: this architecture's size does not "
                          "depend on model.mlp_hidden_size; set equal_params_to=null")
    width = step + (target - low) / ((high - low) / step)
    width = max(step, step * round(width / step))
    return dataclasses.replace(config, mlp_hidden_size=width, equal_params_to=None)


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
