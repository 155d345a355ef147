"""Gated DeltaNet's configuration: the shared skeleton plus the value width, the short
convolution, whether the delta rule decays (DeltaNet: not), and the ranges its decay's dt and A
are drawn from."""

from __future__ import annotations

import dataclasses

from mcsd.models.config import ConfigError, LMConfig, check_range, require_positive_int


@dataclasses.dataclass
class GatedDeltaNetConfig(LMConfig):
    """Gated DeltaNet (Yang, Kautz and Hatamizadeh 2025), heads = ``num_channels``: per head
    keys and queries of the head width ``hidden_size / heads`` and values (and the output gate)
    ``value_expansion`` times it (the paper's layer: 2); a causal convolution of ``conv_size``
    taps over q, k and v (4). ``gated``: the decay ``exp(-A softplus(x w + dt_bias))`` per token
    and head (``False``: DeltaNet's rule, Yang et al. 2024, no decay), dt's bias drawn with
    ``softplus(dt_bias)`` log-uniform in [``dt_min``, ``dt_max``] and ``A`` uniform in
    [``a_min``, ``a_max``] (Mamba-2's draws, which the paper's gate takes). ``chunk_size`` is the
    block of its chunkwise form."""

    chunk_size: int = 32  # measured fastest on a CPU (experiments/train_throughput/gated_deltanet_chunk_size/)
    value_expansion: float = 2.0
    conv_size: int = 4
    gated: bool = True
    dt_min: float = 0.001
    dt_max: float = 0.1
    a_min: float = 1.0
    a_max: float = 16.0

    def __post_init__(self) -> None:
        super().__post_init__()
        width = self.value_expansion * self.channel_width
        if not self.value_expansion > 0 or width != int(width) or width < 1:
            raise ConfigError(f"model.value_expansion={self.value_expansion!r} times the head width "
                              f"({self.channel_width}) must be a whole number of features per head (the paper: 2)")
        require_positive_int("conv_size", self.conv_size)
        if not isinstance(self.gated, bool):
            raise ConfigError(f"model.gated={self.gated!r} must be true (Gated DeltaNet) or false (DeltaNet)")
        check_range("dt_min", self.dt_min, "dt_max", self.dt_max, "the paper's layer: 0.001, 0.1")
        check_range("a_min", self.a_min, "a_max", self.a_max, "Mamba-2's: 1, 16")

    @property
    def value_width(self) -> int:
        return int(self.value_expansion * self.channel_width)
