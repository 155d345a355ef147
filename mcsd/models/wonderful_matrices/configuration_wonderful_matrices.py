"""The Wonderful Matrices hybrid's configuration: SSD mixers with an attention layer every
``attention_every`` layers, the dynamic mask and the CDMoE switch."""

from __future__ import annotations

import dataclasses
import math

from mcsd.models.config import ConfigError, LMConfig, check_attention_every, check_range, is_attention_layer, require_positive_int

MLPS = ("geglu", "cdmoe")
SSD_NORMS = ("per_head", "gate_first")


@dataclasses.dataclass
class WonderfulMatricesConfig(LMConfig):
    """Shi et al. (2024): state-space-duality (SSD) mixers, an attention layer at every
    ``attention_every``-th layer (layers ``r-1, 2r-1, ...``; 0: SSD only), each followed by the
    MLP; RoPE on SSD's B and C and on attention's q and k. Heads = ``num_channels`` for both.

    - SSD: ``ssd_expand`` x D inner width (Mamba-2: 2), ``state_size`` N (the paper's MQAR: 128),
      dt's bias drawn as Mamba-2 does, log-uniform in [``dt_min``, ``dt_max``].
    - ``ssd_norm``: SSD's gated norm. ``per_head`` (the paper's reading, the default):
      ``RMSNorm_per_head(y) * silu(z)``, each head normalised, then gated; ``gate_first``: stock
      Mamba-2's (``norm_before_gate=False``, one group): ``RMSNorm(y * silu(z))`` over the whole
      inner width.
    - ``dynamic_mask``: attention adds the per-key bias exp(A_h softplus(dt_proj(v_j))) to its
      scores (the authors' later version; A starts at 0, a bias of 1 on every key: no effect).
    - ``mlp``: ``geglu`` (the skeleton's, width chosen for equal size) or ``cdmoe`` (a shared
      expert of that width plus ``cdmoe_experts`` single-neuron experts, ``cdmoe_top_k`` of them
      retrieved per head by product keys of width ``cdmoe_retrieval_width``: the authors'
      Doge-MoE-20M setting). The width is chosen with ``mlp=geglu``, so CDMoE adds its experts
      to a model of the same shared width; activated parameters per token are reported apart.
    """

    rope_base: float = 10000.0
    attention_every: int = dataclasses.field(default=4, metadata={"setting": True, "legacy": 4})
    dynamic_mask: bool = dataclasses.field(default=True, metadata={"setting": True, "legacy": True})
    mlp: str = dataclasses.field(default="geglu", metadata={"setting": True, "legacy": "geglu", "sized_at": "geglu"})
    ssd_norm: str = dataclasses.field(default="per_head", metadata={"setting": True, "legacy": "per_head"})
    ssd_expand: int = 2
    state_size: int = 128
    dt_min: float = 0.001
    dt_max: float = 0.1
    cdmoe_experts: int = 1024
    cdmoe_heads: int = 1
    cdmoe_top_k: int = 2
    cdmoe_retrieval_width: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("ssd_expand", "state_size", "cdmoe_experts", "cdmoe_heads", "cdmoe_top_k",
                     "cdmoe_retrieval_width"):
            require_positive_int(name, getattr(self, name))
        check_attention_every(self.attention_every)
        if not isinstance(self.dynamic_mask, bool):
            raise ConfigError(f"model.dynamic_mask={self.dynamic_mask!r} must be true or false")
        if self.mlp not in MLPS:
            raise ConfigError(f"model.mlp={self.mlp!r} is unknown: use one of {', '.join(MLPS)}")
        if self.ssd_norm not in SSD_NORMS:
            raise ConfigError(f"model.ssd_norm={self.ssd_norm!r} is unknown: use one of {', '.join(SSD_NORMS)}")
        if self.attention_every:
            self.require_even_rope_heads()
        for name in ("state_size", "cdmoe_retrieval_width"):
            if getattr(self, name) % 2:
                raise ConfigError(f"model.{name}={getattr(self, name)} must be even (RoPE / product keys "
                                  "split it in halves)")
        side = math.isqrt(self.cdmoe_experts)
        if side * side != self.cdmoe_experts or self.cdmoe_top_k > side:
            raise ConfigError(f"model.cdmoe_experts={self.cdmoe_experts} must be a square s * s with s >= "
                              f"model.cdmoe_top_k={self.cdmoe_top_k} (product keys pick top-k from each of two "
                              "sets of s sub-keys)")
        check_range("dt_min", self.dt_min, "dt_max", self.dt_max, "Mamba-2's: 0.001, 0.1")

    def is_attention_layer(self, layer_index: int) -> bool:
        """Whether layer ``layer_index`` is an attention layer (every ``attention_every``-th)."""
        return is_attention_layer(layer_index, self.attention_every)
