"""The Wonderful Matrices hybrid language model: SSD mixers, an attention layer every
``attention_every`` layers, GeGLU or CDMoE MLPs."""

from __future__ import annotations

from torch import nn

from mcsd.models.modeling import CausalLM
from mcsd.models.modules.attention import CausalSelfAttention
from mcsd.models.modules.mixer import TokenMixer
from mcsd.models.wonderful_matrices.attention import DynamicMaskAttention
from mcsd.models.wonderful_matrices.cdmoe import CrossDomainMoE
from mcsd.models.wonderful_matrices.configuration_wonderful_matrices import WonderfulMatricesConfig
from mcsd.models.wonderful_matrices.ssd import StateSpaceDuality


class WonderfulMatricesForCausalLM(CausalLM):
    """The hybrid language model: the shared skeleton with :class:`StateSpaceDuality` mixers and
    attention layers (:class:`DynamicMaskAttention` unless ``dynamic_mask=false``)."""

    @classmethod
    def make_mixer(cls, config: WonderfulMatricesConfig, layer_index: int) -> TokenMixer:
        if config.is_attention_layer(layer_index):
            return DynamicMaskAttention(config) if config.dynamic_mask else CausalSelfAttention(config)
        return StateSpaceDuality(config)

    @classmethod
    def make_mlp(cls, config: WonderfulMatricesConfig, layer_index: int) -> nn.Module:
        if config.mlp == "geglu":
            return super().make_mlp(config, layer_index)
        return CrossDomainMoE(config)
