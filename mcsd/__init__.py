"""mcsd: MCSD and its baselines in parallel, chunkwise and recurrent forms, and the harness
that trains, benchmarks, plots and evaluates them."""

import mcsd.hf  # noqa: E402,F401  registers model_type "mcsd" with transformers' Auto classes
from mcsd.checkpoint.saved_model import load, load_tokenizer, locate, save
from mcsd.deploy.quantize import quantize_weights
from mcsd.models import (
    Architecture,
    CausalLM,
    ConfigError,
    DecodingState,
    LMConfig,
    architectures,
    build_model,
    count_parameters,
    register,
)

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
    "quantize_weights",
    "register",
    "save",
]
