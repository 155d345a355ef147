"""The Gated DeltaNet language model: the shared skeleton with the gated delta rule's mixer."""

from __future__ import annotations

from mcsd.models.gated_deltanet.configuration_gated_deltanet import GatedDeltaNetConfig
from mcsd.models.gated_deltanet.gated_delta_net import GatedDeltaNetMixer
from mcsd.models.modeling import CausalLM
from mcsd.models.modules.mixer import TokenMixer


class GatedDeltaNetForCausalLM(CausalLM):
    """Gated DeltaNet language model: the shared skeleton with :class:`GatedDeltaNetMixer`
    (the GeGLU MLP after every mixer, as the paper's blocks and every architecture here)."""

    @classmethod
    def make_mixer(cls, config: GatedDeltaNetConfig, layer_index: int) -> TokenMixer:
        return GatedDeltaNetMixer(config)
