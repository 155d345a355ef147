"""The Transformer baseline: the shared skeleton with RoPE causal attention
(:class:`mcsd.models.modules.attention.CausalSelfAttention`)."""

from __future__ import annotations

from mcsd.models.modeling import CausalLM
from mcsd.models.modules.attention import CausalSelfAttention
from mcsd.models.modules.mixer import TokenMixer
from mcsd.models.transformer.configuration_transformer import TransformerConfig


class TransformerForCausalLM(CausalLM):
    """Transformer language model: the shared skeleton with :class:`CausalSelfAttention`."""

    @classmethod
    def make_mixer(cls, config: TransformerConfig, layer_index: int) -> TokenMixer:
        return CausalSelfAttention(config)
