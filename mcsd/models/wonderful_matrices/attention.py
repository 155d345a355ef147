"""The hybrid's attention layer: the shared RoPE attention and KV cache
(:mod:`mcsd.models.modules.attention`, the Transformer's mixer), plus the dynamic mask.

The dynamic mask as the authors' later code has it (Doge): per head h and key j an additive
bias on the attention scores, ``exp(A_h * softplus(dt_proj(v_j))_h)``, with ``v_j`` the key's
value (all heads, ``[H * Dh]``) and ``A`` ``[H]`` learned from 0. At ``A = 0`` every key gets
the same bias 1, which softmax ignores: the layer starts as plain attention. The bias depends
only on the key, so it is computed once per token and cached beside the keys (``KVCache.key_bias``).

The seed paper's first version (a learnable all-ones mask, rounded, multiplied into the causal
mask) has no effect: round() passes no gradient, so the mask stays all ones. It is not built.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mcsd.models.modules.attention import CausalSelfAttention
from mcsd.ops.attention import KVCache
from mcsd.models.wonderful_matrices.configuration_wonderful_matrices import WonderfulMatricesConfig


class DynamicMaskAttention(CausalSelfAttention):
    """:class:`CausalSelfAttention` with the dynamic mask's per-key bias. Initialisation:
    ``dt_proj`` Normal(0, init_std), ``A`` zeros (the authors' code)."""

    def __init__(self, config: WonderfulMatricesConfig) -> None:
        super().__init__(config)
        self.dt_proj = nn.Linear(config.hidden_size, self.num_heads, bias=False)
        self.A = nn.Parameter(torch.empty(self.num_heads))

    def reset_parameters(self) -> None:
        super().reset_parameters()
        nn.init.normal_(self.dt_proj.weight, std=self.init_std)
        nn.init.zeros_(self.A)

    def init_state(self, batch_size: int, capacity: int, device: torch.device, dtype: torch.dtype) -> KVCache:
        cache = super().init_state(batch_size, capacity, device, dtype)
        cache.key_bias = torch.empty(batch_size, self.num_heads, capacity, device=device, dtype=dtype)
        return cache

    def key_bias(self, value: torch.Tensor) -> torch.Tensor:
        batch, heads, length, width = value.shape
        dt = F.softplus(self.dt_proj(value.transpose(1, 2).reshape(batch, length, heads * width)))  # [B, N, H]
        return torch.exp(self.A * dt).transpose(1, 2)  # [B, H, N]
