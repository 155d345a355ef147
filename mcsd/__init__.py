"""mcsd: MCSD and its baselines in parallel, chunkwise and recurrent forms, and the harness
that trains, benchmarks, plots and evaluates them.

Each name below loads on first use (``mcsd.load``, ``mcsd.build_model``, ...), so that a command
imports only what it runs. ``import mcsd.hf`` registers ``model_type="mcsd"`` with transformers'
Auto classes."""

from mcsd.lazy import lazy_names

_MODELS = ("Architecture", "CausalLM", "ConfigError", "DecodingState", "LMConfig", "architectures", "build_model",
           "count_parameters", "register")
_HOMES = {**dict.fromkeys(("load", "load_tokenizer", "locate", "save"), "mcsd.checkpoint.saved_model"),
          "quantize_weights": "mcsd.deploy.quantize", **dict.fromkeys(_MODELS, "mcsd.models")}

__all__ = sorted(_HOMES)
__getattr__, __dir__ = lazy_names(__name__, _HOMES)
