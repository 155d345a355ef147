"""MCSD: the multi-channel slope and decay block in the shared skeleton (Section 2)."""

from mcsd.models.mcsd.block import MCSDBlock, Section, decay_matrix, slope_matrix
from mcsd.models.mcsd.configuration_mcsd import MCSDConfig
from mcsd.models.mcsd.modeling_mcsd import MCSDForCausalLM
from mcsd.models.modules.decays import decay_rates, section_log_decay, slope_rates
from mcsd.models.registry import Architecture, register

register(Architecture(
    name="mcsd",
    config_class=MCSDConfig,
    model_class=MCSDForCausalLM,
    label="MCSD",
    role="subject",
    train_form="chunk",
    ops=("exp_filter",),  # model.kernels: its chunk and recurrent forms through fla's kernels
    fp32_constants=True,  # the slope and decay weights and normalisers (the spec: fp32 whatever the model's dtype)
    variant_group="ablation",  # the paper's word: mcsd-train ablation=slope_only (or variant=slope_only)
    variants={  # Section 3.5's ablations, Eq. 20's fusion, then three switches for recall
        "full": {},
        "slope_only": {"sections": ["slope"]},
        "decay_only": {"sections": ["decay"]},
        "double_slope": {"sections": ["slope", "slope"]},
        "double_decay": {"sections": ["decay", "decay"]},
        "sum_fusion": {"fusion": "sum"},
        # Beyond the paper (issue 90: what MCSD needs to recall), each one switch of the full block:
        "short_conv": {"short_conv": 4},  # a short causal convolution before the block (Mamba's, fla's 4 taps)
        "input_decay": {"input_decay": True},  # the decay section's coefficients from the token (GLA's gate)
        "hybrid_attention": {"attention_every": 2},  # attention at every second layer (the hybrid's recipe)
    },
    setting_cases=({"decay_norm": "sum"}, {"decay_norm_gain_init": 1.0}),
))

__all__ = ["MCSDBlock", "MCSDConfig", "MCSDForCausalLM", "Section", "decay_matrix", "decay_rates",
           "section_log_decay", "slope_matrix", "slope_rates"]
