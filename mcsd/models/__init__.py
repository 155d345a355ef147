"""Model definitions: configs, the shared skeleton, MCSD and the Transformer baseline."""

from mcsd.models.common import CausalLM, DecodingState
from mcsd.models.config import ConfigError, LMConfig, MCSDConfig, TransformerConfig, make_config
from mcsd.models.mcsd import MCSDForCausalLM
from mcsd.models.transformer import TransformerForCausalLM

MODEL_CLASSES: dict[type[LMConfig], type[CausalLM]] = {
    MCSDConfig: MCSDForCausalLM,
    TransformerConfig: TransformerForCausalLM,
}

__all__ = [
    "MODEL_CLASSES",
    "CausalLM",
    "ConfigError",
    "DecodingState",
    "LMConfig",
    "MCSDConfig",
    "MCSDForCausalLM",
    "TransformerConfig",
    "TransformerForCausalLM",
    "make_config",
]
