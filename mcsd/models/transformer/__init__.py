"""The Transformer baseline: MCSD's skeleton with RoPE multi-head causal attention."""

from mcsd.models.common import CausalLM
from mcsd.models.registry import Architecture, register
from mcsd.models.transformer.attention import CausalSelfAttention, KVCache, rotary
from mcsd.models.transformer.config import TransformerConfig


class TransformerForCausalLM(CausalLM):
    """Transformer language model: the shared skeleton with :class:`CausalSelfAttention`."""


register(Architecture(
    name="transformer",
    config_class=TransformerConfig,
    model_class=TransformerForCausalLM,
    label="Transformer",
    color="tab:orange",
    train_form="parallel",  # one causal SDPA call: the flash kernels on a GPU
))

__all__ = ["CausalSelfAttention", "KVCache", "TransformerConfig", "TransformerForCausalLM", "rotary"]
