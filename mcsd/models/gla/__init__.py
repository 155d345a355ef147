"""Gated linear attention (GLA): MCSD's skeleton with a decay per token and key channel."""

from mcsd.models.gla.configuration_gla import GLAConfig
from mcsd.models.gla.gated_linear_attention import GatedLinearAttention
from mcsd.models.gla.modeling_gla import GLAForCausalLM
from mcsd.models.registry import Architecture, register

register(Architecture(
    name="gla",
    config_class=GLAConfig,
    model_class=GLAForCausalLM,
    label="GLA",
    train_form="chunk",
    ops=("gla",),  # model.kernels: its chunk and recurrent forms through fla's chunk_gla and fused_recurrent_gla
    setting_cases=({"short_conv": 4},),
))

__all__ = ["GLAConfig", "GLAForCausalLM", "GatedLinearAttention"]
