"""The MCSD language model: the shared skeleton with :class:`MCSDBlock` as every layer's mixer
(but every ``attention_every``-th, attention, where the hybrid switch is on)."""

from __future__ import annotations

from mcsd.models.config import is_attention_layer
from mcsd.models.mcsd.block import MCSDBlock
from mcsd.models.mcsd.configuration_mcsd import MCSDConfig
from mcsd.models.modeling import CausalLM
from mcsd.models.modules.attention import CausalSelfAttention
from mcsd.models.modules.mixer import TokenMixer


class MCSDForCausalLM(CausalLM):
    """MCSD language model: the shared skeleton with :class:`MCSDBlock` as its layers' mixer, and
    the Transformer's :class:`CausalSelfAttention` at every ``attention_every``-th layer."""

    @classmethod
    def make_mixer(cls, config: MCSDConfig, layer_index: int) -> TokenMixer:
        if is_attention_layer(layer_index, config.attention_every):
            return CausalSelfAttention(config)
        return MCSDBlock(config)
