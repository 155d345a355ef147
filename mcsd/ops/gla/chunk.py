"""Chunkwise form of gated linear attention: the training form.

The sequence is cut into chunks of ``chunk_size`` (the last one zero-padded: a padded token has
``q = k = v = 0`` and log-decay 0, so it adds nothing and decays nothing). Inside every chunk at
once, the parallel form over its own tokens, in sub-chunks of ``SUB_CHUNK`` as fla's ``chunk_gla``
does: a sub-chunk's own ``[s, s, Dk]`` decays from masked sums (:func:`intra_chunk_scores`), and
its scores against the sub-chunks before it as one matmul of queries and keys each scaled by its
part of the decay between them (both ``<= 1``: no ``exp(-G)`` that overflows). Across chunks, with
no Python loop: a chunk adds ``k^T v`` of its tokens decayed to its end, and the state at the end
of chunk ``c`` is the sum over ``c' <= c`` of those, each key channel decayed by the chunks between
(``[Dk, nc, nc]`` of :func:`~mcsd.ops.common.segment_log_decays` over the chunks' totals).
O(N * chunk_size * Dk + nc^2 * Dk * Dv) time, the ``N * chunk_size * Dk`` mostly in matmuls.

Every decay is a sum of log-decays (never the difference of two sums), so a document's start
(-inf) makes nothing before it reach past it, in each part alike.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from mcsd.ops.common import in_state_dtype, segment_log_decays, state_dtype
from mcsd.ops.gla.parallel import key_log_decay, key_segment_log_decays

SUB_CHUNK = 8  # fla uses 16 on a GPU; on the CPU 8 trains 1.2-1.5x faster (64-token chunks; 4, 16, 32, 64 slower)


def intra_chunk_scores(
    q: torch.Tensor, k: torch.Tensor, log_decay: torch.Tensor, sub_chunk: int = SUB_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q``, ``k`` ``[..., L, Dk]``, ``log_decay`` ``[..., L, Dk]`` (fp32) -> the scores
    ``sum_d q_n[d] k_m[d] exp(g_{m+1}[d] + ... + g_n[d])`` ``[..., L, L]`` (0 above the diagonal)
    and each token's decay to the chunk's end ``exp(g_{m+1} + ... + g_L)`` ``[..., L, Dk]``.

    In sub-chunks of ``s`` (``gcd(L, sub_chunk)``): a query in sub-chunk ``a`` reaches a key in an
    earlier one through ``exp(g_{start_a} + ... + g_n)`` (its own) times ``exp(g_{m+1} + ... +
    g_{start_a - 1})`` (the key's, one per ``a``), so those scores are one matmul; inside a
    sub-chunk the ``[s, s, Dk]`` decays of the parallel form."""
    length = q.shape[-2]
    size = math.gcd(length, sub_chunk)
    subs = length // size

    def split(x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-2, (subs, size))  # [..., subs, s, D]

    q_subs, k_subs, log_decay_subs = split(q), split(k), split(log_decay)
    inside = torch.exp(key_segment_log_decays(log_decay_subs))  # [..., subs, s, s, Dk]
    diagonal = torch.einsum("...and,...amd,...anmd->...anm", q_subs, k_subs, inside.to(q.dtype))

    # Key m's decay up to the end of sub-chunk j, sum_{m < r <= end_j} g_r: the rest of its own
    # sub-chunk plus the whole sub-chunks after it up to j (-inf for a key past end_j).
    inclusive = log_decay_subs.flip(-2).cumsum(-2).flip(-2)  # [..., subs, s, Dk]: sum_{m <= r <= its end}
    rest = F.pad(inclusive[..., 1:, :], (0, 0, 0, 1))  # sum_{m < r <= its end}
    between = segment_log_decays(inclusive[..., 0, :].transpose(-1, -2))  # [..., Dk, j, b]: sum of sub-chunks b+1..j
    key_to_end = (rest.unsqueeze(-4) + between.movedim(-3, -1)[..., None, :]).flatten(-3, -2)  # [..., subs_j, L, Dk]

    # A query of sub-chunk a >= 1 against the keys before it (each key to the end of sub-chunk a - 1).
    query_from_start = torch.exp(log_decay_subs.cumsum(-2))  # [..., subs, s, Dk]: g_{start_a} + ... + g_n
    scaled_q = q_subs[..., 1:, :, :] * query_from_start[..., 1:, :, :].to(q.dtype)
    scaled_k = k.unsqueeze(-3) * torch.exp(key_to_end[..., :-1, :, :]).to(k.dtype)
    earlier = F.pad(torch.matmul(scaled_q, scaled_k.transpose(-1, -2)), (0, 0, 0, 0, 1, 0))  # [..., subs, s, L]
    block_diagonal = diagonal.unsqueeze(-2) * torch.eye(subs, dtype=diagonal.dtype, device=q.device)[:, None, :, None]
    scores = earlier + block_diagonal.flatten(-2)  # [..., subs, s, L]
    return scores.flatten(-3, -2), torch.exp(key_to_end[..., -1, :, :])


def chunk_gla(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, chunk_size: int = 64, starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`~mcsd.ops.gla.parallel.parallel_gla` (a start's -inf log-decay
    makes its chunk's total -inf in every channel, so no carry crosses it)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be a positive integer")
    batch, heads, length, key_width = q.shape
    value_width = v.shape[-1]
    accumulate = state_dtype(v)
    num_chunks = -(-length // chunk_size)
    padding = num_chunks * chunk_size - length

    def chunked(x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, (0, 0, 0, padding)).view(batch, heads, num_chunks, chunk_size, x.shape[-1])

    q_chunks, k_chunks, v_chunks = chunked(q), chunked(k), chunked(v)
    log_decay = chunked(key_log_decay(log_decay, starts))  # [B, H, nc, L, Dk]

    # Inside each chunk, from a zero state: the parallel form, in sub-chunks.
    scores, to_end = intra_chunk_scores(q_chunks, k_chunks, log_decay)  # [B, H, nc, L, L], [B, H, nc, L, Dk]
    output = torch.matmul(scores, v_chunks).to(accumulate)

    # What each chunk adds to the state at its end, per key channel.
    added = torch.matmul((k_chunks * to_end.to(k.dtype)).transpose(-1, -2), v_chunks).to(accumulate)

    # The state at the end of each chunk: the chunks' additions, decayed by the chunks after them.
    within = log_decay.cumsum(-2)  # [B, H, nc, L, Dk]: how much of the chunk's starting state is left at t
    chunk_log_decay = within[..., -1, :]  # [B, H, nc, Dk]
    across = torch.exp(segment_log_decays(chunk_log_decay.transpose(-1, -2))).to(accumulate)  # [B, H, Dk, nc, nc]
    carry_in_fp32 = in_state_dtype(q.device)  # the carries stay fp32 under autocast too
    with carry_in_fp32:
        ends = torch.einsum("bhdcs,bhsdv->bhcdv", across, added)  # [B, H, nc, Dk, Dv]
    if initial_state is None:
        initial = torch.zeros(batch, heads, key_width, value_width, device=q.device, dtype=accumulate)
    else:
        initial = initial_state.to(accumulate)
        ends = ends + torch.exp(chunk_log_decay.cumsum(-2))[..., None] * initial[:, :, None]
    chunk_starts = torch.cat([initial[:, :, None], ends[:, :, :-1]], dim=2)  # [B, H, nc, Dk, Dv]

    # The state a chunk starts from reaches its token t decayed by exp(g_start + ... + g_t) per channel.
    with carry_in_fp32:
        output = output + torch.matmul(q_chunks.to(accumulate) * torch.exp(within), chunk_starts)
    output = output.view(batch, heads, num_chunks * chunk_size, value_width)[:, :, :length].contiguous()
    return output.to(v.dtype), ends[:, :, -1]
