"""The Transformer baseline's configuration: the shared skeleton plus RoPE's base."""

from __future__ import annotations

import dataclasses

from mcsd.models.config import LMConfig


@dataclasses.dataclass
class TransformerConfig(LMConfig):
    """The baseline: the same skeleton with RoPE causal attention, heads = ``num_channels``.

    ``chunk_size`` is the query block of its chunkwise form (chunked prefill through the
    KV cache).
    """

    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.require_even_rope_heads()
