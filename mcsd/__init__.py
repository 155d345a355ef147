"""mcsd: MCSD and a Transformer baseline in parallel, chunkwise and recurrent forms."""

from mcsd.api import build_model, count_parameters, load, load_tokenizer, model_dir, save
from mcsd.models import CausalLM, ConfigError, DecodingState, MCSDConfig, TransformerConfig

__all__ = [
    "CausalLM",
    "ConfigError",
    "DecodingState",
    "MCSDConfig",
    "TransformerConfig",
    "build_model",
    "count_parameters",
    "load",
    "load_tokenizer",
    "model_dir",
    "save",
]
