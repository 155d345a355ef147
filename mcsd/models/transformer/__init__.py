"""The Transformer baseline: MCSD's skeleton with RoPE multi-head causal attention."""

from mcsd.models.modules.attention import CausalSelfAttention
from mcsd.models.modules.rotary import rotary
from mcsd.models.registry import Architecture, register
from mcsd.models.transformer.configuration_transformer import TransformerConfig
from mcsd.models.transformer.modeling_transformer import TransformerForCausalLM

register(Architecture(
    name="transformer",
    config_class=TransformerConfig,
    model_class=TransformerForCausalLM,
    label="Transformer",
    role="anchor",
    train_form="parallel",  # one causal SDPA call: the flash kernels on a GPU
    ops=("attention",),
))

__all__ = ["CausalSelfAttention", "TransformerConfig", "TransformerForCausalLM", "rotary"]
