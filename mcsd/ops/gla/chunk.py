"""Chunkwise form of gated linear attention: the training form.

The sequence is cut into chunks of ``chunk_size`` (the last one zero-padded: a padded token has
``q = k = v = 0`` and log-decay 0, so it adds nothing and decays nothing). Inside every chunk at
once, the parallel form over its own tokens (``[L, L, Dk]`` decays from masked sums restarted at
the chunk). Across chunks, with no Python loop: a chunk adds ``k^T v`` of its tokens decayed to
its end, and the state at the end of chunk ``c`` is the sum over ``c' <= c`` of those, each key
channel decayed by the chunks between (``[Dk, nc, nc]`` of
:func:`~mcsd.ops.common.segment_log_decays` over the chunks' totals). O(N * chunk_size
* Dk + nc^2 * Dk * Dv) time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mcsd.ops.common import in_state_dtype, segment_log_decays, state_dtype
from mcsd.ops.gla.parallel import key_log_decay, key_segment_log_decays


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

    # Inside each chunk, from a zero state: the parallel form.
    decay = torch.exp(key_segment_log_decays(log_decay))  # [B, H, nc, L, L, Dk]
    scores = torch.einsum("bhcnd,bhcmd,bhcnmd->bhcnm", q_chunks, k_chunks, decay.to(q.dtype))
    output = torch.matmul(scores, v_chunks).to(accumulate)

    # What each chunk adds to the state at its end, per key channel.
    to_end = decay[..., -1, :, :]  # [B, H, nc, L, Dk]
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
