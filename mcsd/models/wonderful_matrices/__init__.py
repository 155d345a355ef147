"""The Wonderful Matrices hybrid: SSD mixers (on the decayed linear-attention op) with an
attention layer every ``attention_every`` layers, the dynamic mask and the CDMoE switch."""

from mcsd.models.registry import Architecture, register
from mcsd.models.wonderful_matrices.attention import DynamicMaskAttention
from mcsd.models.wonderful_matrices.cdmoe import CrossDomainMoE
from mcsd.models.wonderful_matrices.configuration_wonderful_matrices import WonderfulMatricesConfig
from mcsd.models.wonderful_matrices.modeling_wonderful_matrices import WonderfulMatricesForCausalLM
from mcsd.models.wonderful_matrices.ssd import StateSpaceDuality

register(Architecture(
    name="wonderful_matrices",
    config_class=WonderfulMatricesConfig,
    model_class=WonderfulMatricesForCausalLM,
    label="Wonderful Matrices",
    train_form="chunk",
    ops=("decayed_attention", "attention"),  # model.kernels: decayed attention's chunk and recurrent forms through fla's
    setting_cases=({"attention_every": 2}, {"attention_every": 2, "dynamic_mask": False},
                   {"attention_every": 2, "mlp": "cdmoe"}, {"attention_every": 2, "ssd_norm": "gate_first"}),
))

__all__ = ["CrossDomainMoE", "DynamicMaskAttention", "StateSpaceDuality", "WonderfulMatricesConfig",
           "WonderfulMatricesForCausalLM"]
