"""RetNet: MCSD's skeleton with multi-scale retention (decayed linear attention)."""

from mcsd.models.common import CausalLM
from mcsd.models.registry import Architecture, register
from mcsd.models.retnet.config import RetNetConfig
from mcsd.models.retnet.retention import MultiScaleRetention


class RetNetForCausalLM(CausalLM):
    """RetNet language model: the shared skeleton with :class:`MultiScaleRetention`."""


register(Architecture(
    name="retnet",
    config_class=RetNetConfig,
    model_class=RetNetForCausalLM,
    label="RetNet",
    color="tab:red",
    train_form="chunk",
))

__all__ = ["MultiScaleRetention", "RetNetConfig", "RetNetForCausalLM"]
