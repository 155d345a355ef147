"""Gated linear attention's configuration: the shared skeleton plus the key and value widths,
the decay gate's rank and normaliser, and an optional short convolution."""

from __future__ import annotations

import dataclasses

from mcsd.models.config import ConfigError, LMConfig


@dataclasses.dataclass
class GLAConfig(LMConfig):
    """GLA (Yang et al. 2024), heads = ``num_channels``; per head a key width of
    ``key_expansion`` times ``hidden_size / heads`` (the paper: 0.5) and a value width of
    ``value_expansion`` times it (the paper: 1). The decay per key channel is
    ``logsigmoid(x W_1 W_2 + b) / gate_normalizer`` with ``W_1`` of rank ``gate_rank`` (the
    paper: 16 and 16). ``chunk_size`` is the block of its chunkwise form."""

    chunk_size: int = 32  # measured fastest on a CPU (experiments/train_throughput/gla_chunk_size/)
    key_expansion: float = 0.5
    value_expansion: float = 1.0
    gate_rank: int = 16
    gate_normalizer: float = 16.0
    short_conv: int = dataclasses.field(default=0, metadata={"setting": True, "legacy": 0})
    """Taps of a short causal convolution (then SiLU) on the mixer's input, before q, k, v and
    the gates (:class:`~mcsd.models.modules.conv.ShortConvolution`; 0: none, the paper's)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("key_expansion", "value_expansion"):
            width = getattr(self, name) * self.channel_width
            if not getattr(self, name) > 0 or width != int(width) or width < 1:
                raise ConfigError(f"model.{name}={getattr(self, name)!r} times the head width ({self.channel_width}) "
                                  "must be a whole number of features per head (the paper: key 0.5, value 1)")
        if not isinstance(self.gate_rank, int) or isinstance(self.gate_rank, bool) or self.gate_rank < 1:
            raise ConfigError(f"model.gate_rank={self.gate_rank!r} must be a positive integer (the paper: 16)")
        if not self.gate_normalizer > 0:
            raise ConfigError(f"model.gate_normalizer={self.gate_normalizer!r} must be positive (the paper: 16)")
        if not isinstance(self.short_conv, int) or isinstance(self.short_conv, bool) or self.short_conv < 0:
            raise ConfigError(f"model.short_conv={self.short_conv!r} must be an integer >= 0 (the taps of the "
                              "convolution before q, k and v; 0 for none, e.g. 4)")

    @property
    def key_width(self) -> int:
        return int(self.key_expansion * self.channel_width)

    @property
    def value_width(self) -> int:
        return int(self.value_expansion * self.channel_width)
