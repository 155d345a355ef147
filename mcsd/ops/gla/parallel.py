"""Parallel (reference) form of gated linear attention: decayed linear attention whose decay is
per key channel (Yang et al. 2024, GLA).

For one head with per-token, per-key-channel log-decays ``g_n`` ``[Dk]`` (each ``<= 0``)

    S_n = diag(exp(g_n)) S_{n-1} + k_n^T v_n,      o_n = q_n S_n,

so ``o_n = sum_{m<=n} sum_d q_n[d] k_m[d] exp(g_{m+1}[d] + ... + g_n[d]) v_m`` plus the initial
state's share: the current token is included, as in :mod:`mcsd.ops.decayed_attention` (whose
decay is one per head, or one per token: this op's case of equal channels). This form
materialises the ``[N, N, Dk]`` decays from masked cumulative sums
(:func:`~mcsd.ops.common.segment_log_decays`, never the difference of two cumulative
sums: no ``exp(G_n) / exp(G_m)`` that overflows, as the q-times-exp(G), k-times-exp(-G) trick
would) and is the reference for the chunkwise and recurrent forms.

Documents apart (``starts`` ``[B, N]``): every channel's log-decay is -inf at a document's start,
so nothing before it reaches it, in every form alike.
"""

from __future__ import annotations

import torch

from mcsd.ops.common import segment_log_decays, state_dtype


def key_log_decay(log_decay: torch.Tensor, starts: torch.Tensor | None = None) -> torch.Tensor:
    """``log_decay`` ``[B, H, N, Dk]`` in fp32 (fp64 for fp64 input), -inf at each document's
    start where ``starts`` ``[B, N]`` says one starts."""
    log_decay = log_decay.to(state_dtype(log_decay))
    if starts is not None:
        log_decay = log_decay.masked_fill(starts[:, None, :, None], float("-inf"))
    return log_decay


def key_segment_log_decays(log_decay: torch.Tensor) -> torch.Tensor:
    """``[..., N, Dk]`` -> ``[..., N, N, Dk]``: ``g_{m+1} + ... + g_n`` per channel at ``[n, m]``
    for ``m <= n`` (0 on the diagonal), -inf above it."""
    return segment_log_decays(log_decay.transpose(-1, -2)).movedim(-3, -1)


def parallel_gla(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q``, ``k`` ``[B, H, N, Dk]``, ``v`` ``[B, H, N, Dv]``, ``log_decay`` ``[B, H, N, Dk]``,
    ``initial_state`` ``[B, H, Dk, Dv]``, ``starts`` ``[B, N]`` bool (documents apart). Returns
    the output ``[B, H, N, Dv]`` (dtype of ``v``) and the final state ``[B, H, Dk, Dv]``
    (:func:`~mcsd.ops.common.state_dtype`; the last document's)."""
    accumulate = state_dtype(v)
    log_decay = key_log_decay(log_decay, starts)
    decay = torch.exp(key_segment_log_decays(log_decay))  # [B, H, N, N, Dk], 0 above the diagonal
    scores = torch.einsum("bhnd,bhmd,bhnmd->bhnm", q, k, decay.to(q.dtype))
    output = torch.matmul(scores, v).to(accumulate)
    to_end = decay[..., -1, :, :]  # [B, H, N, Dk]: exp(g_{m+1} + ... + g_last) per channel
    final = torch.matmul((k * to_end.to(k.dtype)).transpose(-1, -2), v).to(accumulate)
    if initial_state is not None:
        initial = initial_state.to(accumulate)
        cumulative = log_decay.cumsum(-2)  # [B, H, N, Dk]: how much of the initial state is left at n
        output = output + torch.matmul(q.to(accumulate) * torch.exp(cumulative), initial)
        final = final + torch.exp(cumulative[..., -1, :])[..., None] * initial
    return output.to(v.dtype), final
