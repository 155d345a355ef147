"""RetNet: MCSD's skeleton with multi-scale retention (decayed linear attention)."""

from mcsd.models.registry import Architecture, register
from mcsd.models.retnet.configuration_retnet import RetNetConfig
from mcsd.models.retnet.modeling_retnet import RetNetForCausalLM
from mcsd.models.retnet.retention import MultiScaleRetention

register(Architecture(
    name="retnet",
    config_class=RetNetConfig,
    model_class=RetNetForCausalLM,
    label="RetNet",
    train_form="chunk",
    ops=("decayed_attention",),  # model.kernels: its chunk and recurrent forms through fla's kernels
    # Its parts one at a time (issue 90: what RetNet needs to recall), each through the conformance suite.
    setting_cases=({"rope": False}, {"retention_norm": False}, {"output_gate": False}, {"decay_offset": 2.0},
                   {"short_conv": 4}),
))

__all__ = ["MultiScaleRetention", "RetNetConfig", "RetNetForCausalLM"]
