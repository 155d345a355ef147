"""Models: the shared skeleton and pieces, the architecture registry, one folder per
architecture, and building a model from a config.

Importing this package imports every architecture folder below it, each of which registers
itself (:func:`mcsd.models.registry.register`); nothing here lists them by hand.
"""

import importlib
import pkgutil

from mcsd.models.config import ConfigError, LMConfig
from mcsd.models.modeling import CausalLM
from mcsd.models.modules.mixer import TokenMixer
from mcsd.models.modules.state import DecodingState, LayerState
from mcsd.models.registry import Architecture, architectures, register
from mcsd.ops.context import ForwardContext

ARCHITECTURE_FOLDERS = [module.name for module in pkgutil.iter_modules(__path__)
                        if module.ispkg and module.name != "modules"]
"""The architecture folders under ``mcsd/models/`` (every subpackage but the shared ``modules``)."""

for _name in ARCHITECTURE_FOLDERS:
    importlib.import_module(f"{__name__}.{_name}")

from mcsd.models.build import build_model, count_parameters, make_config  # noqa: E402  (after the registrations)

__all__ = [
    "ARCHITECTURE_FOLDERS",
    "Architecture",
    "CausalLM",
    "ConfigError",
    "DecodingState",
    "ForwardContext",
    "LayerState",
    "LMConfig",
    "TokenMixer",
    "architectures",
    "build_model",
    "count_parameters",
    "make_config",
    "register",
]
