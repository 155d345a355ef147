"""The MCSD language model: the shared skeleton with :class:`MCSDBlock` as every layer's mixer."""

from __future__ import annotations

from mcsd.models.mcsd.block import MCSDBlock
from mcsd.models.mcsd.configuration_mcsd import MCSDConfig
from mcsd.models.modeling import CausalLM
from mcsd.models.modules.mixer import TokenMixer


class MCSDForCausalLM(CausalLM):
    """MCSD language model: the shared skeleton with :class:`MCSDBlock` as every layer's mixer."""

    @classmethod
    def make_mixer(cls, config: MCSDConfig, layer_index: int) -> TokenMixer:
        return MCSDBlock(config)
