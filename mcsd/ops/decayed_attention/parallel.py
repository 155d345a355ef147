"""Parallel (reference) form of decayed linear attention.

For one head with per-token log-decays ``g_n <= 0`` the state and output are

    S_n = exp(g_n) S_{n-1} + k_n^T v_n,      o_n = q_n S_n,

so ``o_n = sum_{m<=n} exp(g_{m+1} + ... + g_n) (q_n . k_m) v_m + exp(G_n) q_n S_init`` with
the cumulative log-decay ``G_n = g_0 + ... + g_n``: the current token is included (RetNet's
retention; Mamba-2's SSD with ``q = C``, ``k = B``, ``v = dt x``). This form materialises the
``[N, N]`` decay matrix from :func:`segment_log_decays` (-inf above the diagonal before
``exp``, so no entry overflows) and is the reference for the chunkwise and recurrent forms.

Documents apart (``starts`` ``[B, N]``, True where a document of a packed row starts): the
log-decay of a start is -inf (:func:`per_token_log_decay`), so ``exp`` of every sum that spans
it is exactly 0 and the state before it is dropped, in every form alike: the segment sums are
masked cumulative sums (no difference of two of them, so no ``inf - inf``), and the chunk form's
carries are ``exp`` of such sums too.
"""

from __future__ import annotations

import torch

from mcsd.ops.common import segment_log_decays, state_dtype


def per_token_log_decay(
    log_decay: torch.Tensor, batch: int, length: int, starts: torch.Tensor | None = None
) -> torch.Tensor:
    """``log_decay`` as ``[B, H, N]`` in fp32 (fp64 for fp64 input): a constant per head
    (``[H]``, RetNet) is broadcast over batch and positions; a per-token one (``[B, H, N]``,
    SSD) is taken as it is. With ``starts`` ``[B, N]``, -inf at each document's start."""
    log_decay = log_decay.to(state_dtype(log_decay))
    if log_decay.dim() == 1:
        log_decay = log_decay[None, :, None].expand(batch, -1, length)
    if starts is not None:
        log_decay = log_decay.masked_fill(starts[:, None, :], float("-inf"))
    return log_decay


def parallel_decayed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q``, ``k`` ``[B, H, N, Dk]``, ``v`` ``[B, H, N, Dv]``, ``log_decay`` ``[H]`` or
    ``[B, H, N]``, ``initial_state`` ``[B, H, Dk, Dv]``, ``starts`` ``[B, N]`` bool (documents
    apart). Returns the output ``[B, H, N, Dv]`` (dtype of ``v``) and the final state
    ``[B, H, Dk, Dv]`` (:func:`state_dtype`; the last document's)."""
    batch, _, length, _ = q.shape
    accumulate = state_dtype(v)
    log_decay = per_token_log_decay(log_decay, batch, length, starts)
    segments = segment_log_decays(log_decay)
    decay = torch.exp(segments)  # exp(g_{m+1} + ... + g_n), 0 above the diagonal
    scores = torch.matmul(q, k.transpose(-1, -2)) * decay.to(q.dtype)
    output = torch.matmul(scores, v).to(accumulate)
    to_end = decay[..., -1, :]  # exp(g_{m+1} + ... + g_last)
    cumulative = log_decay.cumsum(-1)  # G_n: how much of the initial state is left at n
    final = torch.matmul((k * to_end[..., None].to(k.dtype)).transpose(-1, -2), v).to(accumulate)
    if initial_state is not None:
        initial = initial_state.to(accumulate)
        output = output + torch.exp(cumulative)[..., None] * torch.matmul(q.to(accumulate), initial)
        final = final + torch.exp(cumulative[..., -1])[..., None, None] * initial
    return output.to(v.dtype), final
