"""The Mamba-2 language model: the shared skeleton with Mamba-2's SSD layer."""

from __future__ import annotations

from mcsd.models.mamba2.configuration_mamba2 import Mamba2Config
from mcsd.models.mamba2.ssd import Mamba2Mixer
from mcsd.models.modeling import CausalLM
from mcsd.models.modules.mixer import TokenMixer


class Mamba2ForCausalLM(CausalLM):
    """Mamba-2 language model: the shared skeleton with :class:`Mamba2Mixer` (the GeGLU MLP
    after every mixer, as every architecture here; the paper's Mamba-2 has no MLP)."""

    @classmethod
    def make_mixer(cls, config: Mamba2Config, layer_index: int) -> TokenMixer:
        return Mamba2Mixer(config)
