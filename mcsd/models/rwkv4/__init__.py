"""RWKV-4: MCSD's skeleton with RWKV's time mix (the WKV op) and channel mix, and the
multiple-temporal-perspectives switch (``perspectives``)."""

from mcsd.models.registry import Architecture, register
from mcsd.models.rwkv4.configuration_rwkv4 import RWKV4Config
from mcsd.models.rwkv4.modeling_rwkv4 import RWKV4ForCausalLM
from mcsd.models.rwkv4.time_mix import ChannelMix, TimeMix

register(Architecture(
    name="rwkv4",
    config_class=RWKV4Config,
    model_class=RWKV4ForCausalLM,
    label="RWKV-4",
    train_form="chunk",
    ops=("wkv",),  # model.kernels: its chunk and recurrent forms through fla's kernels
    setting_cases=({"perspectives": 2},),
))

__all__ = ["ChannelMix", "RWKV4Config", "RWKV4ForCausalLM", "TimeMix"]
