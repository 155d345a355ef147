"""Mamba-2: MCSD's skeleton with the SSD layer (a decay per token and head, from dt)."""

from mcsd.models.mamba2.configuration_mamba2 import Mamba2Config
from mcsd.models.mamba2.modeling_mamba2 import Mamba2ForCausalLM
from mcsd.models.mamba2.ssd import Mamba2Mixer
from mcsd.models.registry import Architecture, register

register(Architecture(
    name="mamba2",
    config_class=Mamba2Config,
    model_class=Mamba2ForCausalLM,
    label="Mamba-2",
    train_form="chunk",
    setting_cases=({"in_proj_init": "uniform"}, {"skip_init": 0.0}),
    ops=("decayed_attention",),  # model.kernels: its chunk and recurrent forms through fla's simple GLA kernels
))

__all__ = ["Mamba2Config", "Mamba2ForCausalLM", "Mamba2Mixer"]
