"""Parallel (reference) form of RWKV-4's WKV, stable in log-space.

Per channel, with decay rate ``w > 0`` and bonus ``u``, token ``t`` of a sequence reads

    wkv_t = [e^{p0 - t w} a0 + sum_{i<t} e^{-(t-1-i) w + k_i} v_i + e^{u + k_t} v_t]
            / [e^{p0 - t w} b0 + sum_{i<t} e^{-(t-1-i) w + k_i}     + e^{u + k_t}]

where the carried state ``(a0, b0, p0)`` holds the previous tokens' numerator and
denominator scaled by ``e^{-p0}``. Every term is a logit ``l`` times a value; the sums are
taken after subtracting the largest logit of the row, so nothing is exponentiated
unguarded (``e^k`` overflows fp32 above k = 88). The state after the sequence is the same
sum as seen by the next token, with ``p`` its largest logit. Materialises
``[B, N, N + 1, D]``: the reference for the chunkwise and recurrent forms.
"""

from __future__ import annotations

import torch

from mcsd.ops.exp_filter.naive import state_dtype

EMPTY_LOG_SCALE = -1e38  # p of an empty state: e^{p - anything} is exactly 0, and p stays finite


def empty_wkv_state(batch: int, channels: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The state before any token: ``a = b = 0``, ``p = -1e38``; shape ``[B, 3, D]`` (a, b, p)."""
    state = torch.zeros(batch, 3, channels, device=device, dtype=dtype)
    state[:, 2] = EMPTY_LOG_SCALE
    return state


def parallel_wkv(
    w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor, initial_state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``w``, ``u`` ``[D]`` (w: the decay rate, positive), ``k``, ``v`` ``[B, N, D]``,
    ``initial_state`` ``[B, 3, D]`` (a, b, p) -> (``wkv [B, N, D]`` in v's dtype, final state
    ``[B, 3, D]`` fp32)."""
    dtype, output_dtype = state_dtype(v), v.dtype
    batch, length, channels = k.shape
    state = (empty_wkv_state(batch, channels, k.device, dtype) if initial_state is None else initial_state.to(dtype))
    w, u, k, v = w.to(dtype), u.to(dtype), k.to(dtype), v.to(dtype)
    positions = torch.arange(length + 1, device=k.device, dtype=dtype)
    # Logits of token t (rows 0..N, row N: the next token, for the final state) for past token
    # i (columns 0..N-1) and for the carried state (column N).
    distance = positions[:, None] - 1 - positions[None, :length]  # t - 1 - i
    past = (-distance[..., None] * w + k[:, None, :, :]).masked_fill((distance < 0)[..., None], float("-inf"))
    diagonal = torch.arange(length, device=k.device)
    bonus = torch.full_like(past, float("-inf"))
    bonus[:, diagonal, diagonal] = u + k
    token_logits = torch.where(distance[..., None] == -1, bonus, past)[:, :length]
    carried = (state[:, None, 2] - positions[:, None] * w)[:, :, None]  # [B, N + 1, 1, D]
    logits = torch.cat([token_logits, carried[:, :length]], dim=2)  # [B, N, N + 1, D]
    scale = logits.amax(dim=2, keepdim=True).detach()
    weights = torch.exp(logits - scale)
    numerator = (weights[:, :, :length] * v[:, None]).sum(2) + weights[:, :, length] * state[:, None, 0]
    denominator = weights[:, :, :length].sum(2) + weights[:, :, length] * state[:, None, 1]
    output = numerator / denominator
    # The state for the next token: past tokens all at distance >= 0, no bonus.
    final_logits = torch.cat([past[:, length], carried[:, length]], dim=1)  # [B, N + 1, D]
    final_scale = final_logits.amax(dim=1, keepdim=True).detach()
    final_weights = torch.exp(final_logits - final_scale)
    final_a = (final_weights[:, :length] * v).sum(1) + final_weights[:, length] * state[:, 0]
    final_b = final_weights[:, :length].sum(1) + final_weights[:, length] * state[:, 1]
    final_state = torch.stack([final_a, final_b, final_scale[:, 0]], dim=1)
    return output.to(output_dtype), final_state
