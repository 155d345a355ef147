"""RWKV-4's configuration: the shared skeleton; its MLP is RWKV's channel mix of width
``mlp_hidden_size`` (chosen for equal size), its mixer the WKV time mix."""

from __future__ import annotations

import dataclasses

from torch import nn

from mcsd.models.common import TokenMixer
from mcsd.models.config import LMConfig


@dataclasses.dataclass
class RWKV4Config(LMConfig):
    """RWKV-4 (Peng et al. 2023): per-channel time mix (token shift, WKV with learned decay
    and bonus, receptance gate) and channel mix (token shift, squared ReLU, receptance gate).
    ``chunk_size`` is the block of the WKV's chunkwise form."""

    def make_mixer(self, layer_index: int) -> TokenMixer:
        from mcsd.models.rwkv4.time_mix import TimeMix

        return TimeMix(self, layer_index)

    def make_mlp(self, layer_index: int) -> nn.Module:
        from mcsd.models.rwkv4.time_mix import ChannelMix

        return ChannelMix(self, layer_index)
