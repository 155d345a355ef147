"""The RetNet language model: the shared skeleton with multi-scale retention."""

from __future__ import annotations

from mcsd.models.modeling import CausalLM
from mcsd.models.modules.mixer import TokenMixer
from mcsd.models.retnet.configuration_retnet import RetNetConfig
from mcsd.models.retnet.retention import MultiScaleRetention
from mcsd.models.retnet.torchscale_retention import TorchscaleRetention


class RetNetForCausalLM(CausalLM):
    """RetNet language model: the shared skeleton with :class:`MultiScaleRetention` (or
    torchscale's layer, :class:`TorchscaleRetention`, with ``implementation: torchscale``)."""

    @classmethod
    def make_mixer(cls, config: RetNetConfig, layer_index: int) -> TokenMixer:
        if config.implementation == "torchscale":
            return TorchscaleRetention(config)
        return MultiScaleRetention(config)
