"""Causal attention from a sequence's start through SDPA's fused kernel, an additive bias per key
folded into one more feature (no ``[N, N]`` mask), and the masked form of such a bias."""

from __future__ import annotations

import torch
import torch.nn.functional as F

FUSED_WIDTH_MULTIPLE = 8
"""The fused GPU attention kernels (flash, memory-efficient, cuDNN) take 16-bit heads whose width
is a multiple of 8; any other width falls back to the math kernel and its full ``N x N`` scores."""


def causal_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Causal attention of ``query``, ``key``, ``value`` ``[B, H, N, Dh]`` from position 0, with an
    optional additive bias per key ``[B, H, N]``, through SDPA's fused causal kernel. The bias is
    folded into one more feature, ``s q.k + b = s [q, 1].[k, b / s]`` (``s`` the usual
    ``Dh^-1/2``), so no ``[N, N]`` mask is made (at 16384 tokens the hybrid's mask and its
    gradient took 16 GB); the heads are padded with zero features to the next multiple of
    :data:`FUSED_WIDTH_MULTIPLE` (the values too: the kernels want one width), which a fused GPU
    kernel takes (``Dh + 1`` would not)."""
    if key_bias is None:
        return F.scaled_dot_product_attention(query, key, value, is_causal=True)
    width = query.shape[-1]
    scale = width**-0.5
    padding = -(width + 1) % FUSED_WIDTH_MULTIPLE  # zero features after the bias's

    def padded(x: torch.Tensor, *features: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, *features, x.new_zeros(*x.shape[:-1], padding)], dim=-1)

    query = padded(query, torch.ones_like(query[..., :1]))
    key = padded(key, (key_bias / scale).to(key.dtype)[..., None])
    value = padded(value, torch.zeros_like(value[..., :1]))
    return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale)[..., :width]


def biased_mask(key_bias: torch.Tensor, first_query: int, num_queries: int) -> torch.Tensor:
    """The additive attention mask ``[B, H, num_queries, K]`` of queries at absolute positions
    ``first_query..`` over keys ``0..K-1`` with a bias per key ``[B, H, K]``: the key's bias
    where the key is not after the query, -inf where it is."""
    keys = key_bias.shape[-1]
    rows = torch.arange(first_query, first_query + num_queries, device=key_bias.device)
    future = rows[:, None] < torch.arange(keys, device=key_bias.device)[None, :]
    return key_bias[..., None, :].masked_fill(future, float("-inf"))
