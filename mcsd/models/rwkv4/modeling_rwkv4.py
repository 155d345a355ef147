"""The RWKV-4 language model: the shared skeleton with the time mix as mixer, the channel mix as
MLP, and ``perspectives`` residual streams."""

from __future__ import annotations

from torch import nn

from mcsd.models.modeling import CausalLM
from mcsd.models.modules.mixer import TokenMixer
from mcsd.models.rwkv4.configuration_rwkv4 import RWKV4Config
from mcsd.models.rwkv4.perspectives import Perspectives
from mcsd.models.rwkv4.time_mix import ChannelMix, TimeMix


class RWKV4ForCausalLM(CausalLM):
    """RWKV-4 language model: the shared skeleton with :class:`TimeMix` and :class:`ChannelMix`."""

    @classmethod
    def make_streams(cls, config: RWKV4Config) -> nn.Module:
        if config.perspectives == 1:
            return super().make_streams(config)
        return Perspectives(config.perspectives, config.hidden_size, config.aggregator_init_std)

    @classmethod
    def make_mixer(cls, config: RWKV4Config, layer_index: int) -> TokenMixer:
        return TimeMix(config, layer_index)

    @classmethod
    def make_mlp(cls, config: RWKV4Config, layer_index: int) -> nn.Module:
        return ChannelMix(config, layer_index)
