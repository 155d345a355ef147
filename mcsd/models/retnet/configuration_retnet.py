"""RetNet's configuration: the shared skeleton plus the value width and RoPE's base."""

from __future__ import annotations

import dataclasses

from mcsd.models.config import ConfigError, LMConfig


@dataclasses.dataclass
class RetNetConfig(LMConfig):
    """Multi-scale retention, heads = ``num_channels``, key width ``hidden_size / heads``,
    value (and gate) width ``value_expansion`` times that per head (the paper: 2).
    ``chunk_size`` is the block of its chunkwise form."""

    value_expansion: int = 2
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_even_rope_heads()
        if not isinstance(self.value_expansion, int) or self.value_expansion < 1:
            raise ConfigError(f"model.value_expansion={self.value_expansion!r} must be a positive integer "
                              "(the value width per head in key widths; the paper: 2)")
