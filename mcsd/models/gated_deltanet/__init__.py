"""Gated DeltaNet: MCSD's skeleton with the gated delta rule (a decay per token and head, then
a write that replaces what the key reads); DeltaNet as its variant without the decay."""

from mcsd.models.gated_deltanet.configuration_gated_deltanet import GatedDeltaNetConfig
from mcsd.models.gated_deltanet.gated_delta_net import GatedDeltaNetMixer
from mcsd.models.gated_deltanet.modeling_gated_deltanet import GatedDeltaNetForCausalLM
from mcsd.models.registry import Architecture, register

register(Architecture(
    name="gated_deltanet",
    config_class=GatedDeltaNetConfig,
    model_class=GatedDeltaNetForCausalLM,
    label="Gated DeltaNet",
    train_form="chunk",
    variants={"default": {}, "deltanet": {"gated": False}},  # DeltaNet (Yang et al. 2024): the rule without decay
    ops=("delta_rule",),  # model.kernels: its chunk and recurrent forms through fla's gated delta rule kernels
))

__all__ = ["GatedDeltaNetConfig", "GatedDeltaNetForCausalLM", "GatedDeltaNetMixer"]
