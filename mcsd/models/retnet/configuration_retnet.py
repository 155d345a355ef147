"""RetNet's configuration: the shared skeleton plus the value width and RoPE's base."""

from __future__ import annotations

import dataclasses

from mcsd.models.config import ConfigError, LMConfig

IMPLEMENTATIONS = ("mcsd", "torchscale")
"""Whose retention layer a RetNet builds (``model.implementation``)."""


@dataclasses.dataclass
class RetNetConfig(LMConfig):
    """Multi-scale retention, heads = ``num_channels``, key width ``hidden_size / heads``,
    value (and gate) width ``value_expansion`` times that per head (the paper: 2).
    ``chunk_size`` is the block of its chunkwise form."""

    value_expansion: int = 2
    rope_base: float = 10000.0
    # RetNet's parts, one switch each, for the study of what it needs to recall (issue 90; a
    # "setting": plots name the runs that change one; "legacy": runs logged before it existed).
    rope: bool = dataclasses.field(default=True, metadata={"setting": True, "legacy": True})
    """Whether q and k are rotated (RoPE); without it retention sees positions through its decays alone."""
    retention_norm: bool = dataclasses.field(default=True, metadata={"setting": True, "legacy": True})
    """Whether the retention output is normalised per head (RetNet's GroupNorm, an RMSNorm here)."""
    output_gate: bool = dataclasses.field(default=True, metadata={"setting": True, "legacy": True})
    """Whether the output is gated by ``swish(X W_G)``; without it there is no ``W_G``."""
    decay_offset: float = dataclasses.field(default=5.0, metadata={"setting": True, "legacy": 5.0})
    """The decays ``gamma_h = 1 - 2^(-decay_offset-h)``: 5 is the paper's; 2 gives memories 8x shorter."""
    short_conv: int = dataclasses.field(default=0, metadata={"setting": True, "legacy": 0})
    """Taps of a short causal convolution (then SiLU) on the mixer's input, before q, k, v and the
    gate (:class:`~mcsd.models.modules.conv.ShortConvolution`; 0: none, the paper's)."""
    implementation: str = dataclasses.field(default="mcsd", metadata={"setting": True, "legacy": "mcsd"})
    """Whose layer: ``mcsd`` (this project's) or ``torchscale`` (Microsoft's own ``MultiScaleRetention``,
    an independent implementation to train beside it: :mod:`mcsd.models.retnet.torchscale_retention`;
    it takes ``rope`` and ``decay_offset``, not the other parts' switches)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rope:
            self.require_even_rope_heads()
        for name in ("rope", "retention_norm", "output_gate"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"model.{name}={getattr(self, name)!r} must be true or false")
        if not isinstance(self.short_conv, int) or isinstance(self.short_conv, bool) or self.short_conv < 0:
            raise ConfigError(f"model.short_conv={self.short_conv!r} must be an integer >= 0 (the taps of the "
                              "convolution before q, k and v; 0 for none, e.g. 4)")
        if self.implementation not in IMPLEMENTATIONS:
            raise ConfigError(f"model.implementation={self.implementation!r} is unknown: use one of "
                              f"{', '.join(IMPLEMENTATIONS)}")
        if self.implementation == "torchscale":
            fixed = {"retention_norm": True, "output_gate": True, "short_conv": 0, "kernels": "auto"}
            for name, value in fixed.items():
                if getattr(self, name) != value:
                    raise ConfigError(f"model.{name}={getattr(self, name)!r} is not a switch of torchscale's layer "
                                      f"(model.implementation=torchscale): leave it at {value!r} or use "
                                      "model.implementation=mcsd")
        if not self.decay_offset > 0:
            raise ConfigError(f"model.decay_offset={self.decay_offset!r} must be positive (decays 1 - 2^(-offset-h) "
                              "in (0, 1); the paper's: 5)")
        if not isinstance(self.value_expansion, int) or self.value_expansion < 1:
            raise ConfigError(f"model.value_expansion={self.value_expansion!r} must be a positive integer "
                              "(the value width per head in key widths; the paper: 2)")
