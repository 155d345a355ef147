"""Parallel (reference) form of RWKV-4's WKV, stable in log-space.

Per channel, with decay rate ``w > 0`` and bonus ``u``, token ``t`` of a sequence reads

    wkv_t = [e^{p0 - t w} a0 + sum_{i<t} e^{-(t-1-i) w + k_i} v_i + e^{u + k_t} v_t]
            / [e^{p0 - t w} b0 + sum_{i<t} e^{-(t-1-i) w + k_i}     + e^{u + k_t}]

where the carried state ``(a0, b0, p0)`` holds the previous tokens' numerator and
denominator scaled by ``e^{-p0}``. Every term is a logit ``l`` times a value; the sums are
taken after subtracting the largest logit of the row, so nothing is exponentiated
unguarded (``e^k`` overflows fp32 above k = 88). The state after the sequence is the same
sum as seen by the next token, with ``p`` its largest logit. Materialises
``[B, N, N, D]``: the reference for the chunkwise and recurrent forms, and the chunkwise
form's work inside each chunk.

Documents apart (``starts`` ``[B, N]``, True where a document of a packed row starts): a token
reads only the tokens of its own document, and the carried state only until the row's first
start; every other logit is :data:`EMPTY_LOG_SCALE` (weight exactly 0, every number finite).
"""

from __future__ import annotations

import torch

from mcsd.ops.common import document_index, state_dtype

EMPTY_LOG_SCALE = -1e38  # p of an empty state: e^{p - anything} is exactly 0, and p stays finite


def empty_wkv_state(batch: int, channels: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The state before any token: ``a = b = 0``, ``p = -1e38``; shape ``[B, 3, D]`` (a, b, p)."""
    state = torch.zeros(batch, 3, channels, device=device, dtype=dtype)
    state[:, 2] = EMPTY_LOG_SCALE
    return state


def token_offsets(w: torch.Tensor, u: torch.Tensor, length: int) -> torch.Tensor:
    """What token ``t`` adds to past token ``i``'s key in its logit: ``-(t - 1 - i) w`` for
    ``i < t``, the bonus ``u`` for ``i = t``, ``-inf`` after it; ``[N, N, D]``, built once per call
    (not per row), so that a row's logits are one addition."""
    positions = torch.arange(length, device=w.device)
    distance = (positions[:, None] - 1 - positions[None, :]).to(w.dtype)  # t - 1 - i
    offsets = torch.where((distance == -1)[..., None], u, -distance[..., None] * w)
    return offsets.masked_fill((distance < -1)[..., None], float("-inf"))


def wkv_outputs(
    w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor,
    same: torch.Tensor | None = None, carried_visible: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every token's wkv from the carried ``state`` (``[B, 3, D]``) and the tokens before it, all
    in the state's dtype: ``[B, N, D]``. The carried state's logit at ``t`` is ``p0 - t w``; each
    row's sums are taken after subtracting the row's largest logit. Documents apart: ``same``
    ``[B, t, i]`` (token ``i`` is of ``t``'s document) and ``carried_visible`` ``[B, t]`` (the
    carried state is of ``t``'s document)."""
    length = k.shape[1]
    logits = k[:, None] + token_offsets(w, u, length)  # [B, t, i, D]
    carried = state[:, None, 2] - torch.arange(length, device=k.device, dtype=w.dtype)[:, None] * w  # [B, t, D]
    if same is not None:
        logits = logits.masked_fill(~same[..., None], EMPTY_LOG_SCALE)
        carried = carried.masked_fill(~carried_visible[..., None], EMPTY_LOG_SCALE)
    scale = torch.maximum(logits.amax(dim=2), carried).detach()
    weights = torch.exp(logits - scale[:, :, None])
    carried_weight = torch.exp(carried - scale)
    numerator = (weights * v[:, None]).sum(2) + carried_weight * state[:, None, 0]
    denominator = weights.sum(2) + carried_weight * state[:, None, 1]
    return numerator / denominator


def parallel_wkv(
    w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor, initial_state: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``w``, ``u`` ``[D]`` (w: the decay rate, positive), ``k``, ``v`` ``[B, N, D]``,
    ``initial_state`` ``[B, 3, D]`` (a, b, p), ``starts`` ``[B, N]`` bool (documents apart) ->
    (``wkv [B, N, D]`` in v's dtype, final state ``[B, 3, D]`` fp32: the last document's)."""
    dtype, output_dtype = state_dtype(v), v.dtype
    batch, length, channels = k.shape
    state = (empty_wkv_state(batch, channels, k.device, dtype) if initial_state is None else initial_state.to(dtype))
    w, u, k, v = w.to(dtype), u.to(dtype), k.to(dtype), v.to(dtype)
    same = carried_visible = None
    if starts is not None:
        index = document_index(starts)
        same, carried_visible = index[:, :, None] == index[:, None, :], index == 0
    output = wkv_outputs(w, u, k, v, state, same, carried_visible)
    # The state for the next token (t = N): every token at distance N - 1 - i, no bonus.
    positions = torch.arange(length, device=k.device, dtype=dtype)
    final_logits = torch.cat([k - (length - 1 - positions)[:, None] * w, (state[:, 2] - length * w)[:, None]], dim=1)
    if starts is not None:  # the last document's tokens, and the carried state if no document started
        final_logits = final_logits.masked_fill(~torch.cat([same[:, -1], carried_visible[:, -1:]], 1)[..., None],
                                                EMPTY_LOG_SCALE)
    final_scale = final_logits.amax(dim=1, keepdim=True).detach()  # [B, 1, D]
    final_weights = torch.exp(final_logits - final_scale)
    final_a = (final_weights[:, :-1] * v).sum(1) + final_weights[:, -1] * state[:, 0]
    final_b = final_weights[:, :-1].sum(1) + final_weights[:, -1] * state[:, 1]
    final_state = torch.stack([final_a, final_b, final_scale[:, 0]], dim=1)
    return output.to(output_dtype), final_state
