"""Models: the shared skeleton, the architecture registry and one folder per architecture.

Importing this package imports every architecture folder below it, each of which registers
itself (:func:`mcsd.models.registry.register`); nothing here lists them by hand.
"""

import importlib
import pkgutil

from mcsd.models.common import CausalLM, DecodingState, LayerState, TokenMixer
from mcsd.models.config import ConfigError, LMConfig, make_config
from mcsd.models.registry import Architecture, architectures, register

for _module in pkgutil.iter_modules(__path__):
    if _module.ispkg:
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "Architecture",
    "CausalLM",
    "ConfigError",
    "DecodingState",
    "LayerState",
    "LMConfig",
    "TokenMixer",
    "architectures",
    "make_config",
    "register",
]
