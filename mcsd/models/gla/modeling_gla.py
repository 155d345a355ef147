"""The GLA language model: the shared skeleton with gated linear attention."""

from __future__ import annotations

from mcsd.models.gla.configuration_gla import GLAConfig
from mcsd.models.gla.gated_linear_attention import GatedLinearAttention
from mcsd.models.modeling import CausalLM
from mcsd.models.modules.mixer import TokenMixer


class GLAForCausalLM(CausalLM):
    """GLA language model: the shared skeleton with :class:`GatedLinearAttention`."""

    @classmethod
    def make_mixer(cls, config: GLAConfig, layer_index: int) -> TokenMixer:
        return GatedLinearAttention(config)
