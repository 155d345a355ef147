"""mcsd: MCSD and its baselines in parallel, chunkwise and recurrent forms, and the harness
that trains, benchmarks, plots and evaluates them."""

from mcsd.api import build_model, count_parameters
from mcsd.models import Architecture, CausalLM, ConfigError, DecodingState, LMConfig, architectures, register
from mcsd.saved_model import load, load_tokenizer, locate, save

import mcsd.hf  # noqa: E402,F401  registers model_type "mcsd" with transformers' Auto classes

__all__ = [
    "Architecture",
    "CausalLM",
    "ConfigError",
    "DecodingState",
    "LMConfig",
    "architectures",
    "build_model",
    "count_parameters",
    "load",
    "load_tokenizer",
    "locate",
    "register",
    "save",
]
