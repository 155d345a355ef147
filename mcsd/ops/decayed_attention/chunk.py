"""Chunkwise form of decayed linear attention: the training form (RetNet's Eq. 7).

The sequence is cut into chunks of ``chunk_size`` (the last one zero-padded: a padded token
has ``q = k = v = 0`` and log-decay 0, so it adds nothing and decays nothing). Inside every
chunk at once, the parallel form over its own tokens (cumulative log-decays restart at the
chunk, so exponents stay small). Across chunks, the state each chunk starts from is computed
for all chunks at once, with no Python loop: a chunk adds ``k^T v`` of its tokens decayed to
its end, and the state at the end of chunk ``c`` is the sum over ``c' <= c`` of those, decayed
by the chunks between (one ``[nc, nc]`` matrix of :func:`segment_log_decays` over the chunks'
total log-decays, ``exp``'d). O(N * chunk_size + nc^2 * Dk * Dv) time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mcsd.ops.common import in_state_dtype, segment_log_decays, state_dtype
from mcsd.ops.decayed_attention.parallel import per_token_log_decay


def chunk_decayed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, chunk_size: int = 64, starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`parallel_decayed_attention` (a start's -inf log-decay makes a
    chunk's total -inf too, so no carry crosses it)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be a positive integer")
    batch, heads, length, key_width = q.shape
    value_width = v.shape[-1]
    accumulate = state_dtype(v)
    num_chunks = -(-length // chunk_size)  # compiled, multiples of the chunk take a graph of their own
    padding = num_chunks * chunk_size - length

    def chunked(x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, (0, 0, 0, padding)).view(batch, heads, num_chunks, chunk_size, x.shape[-1])

    q_chunks, k_chunks, v_chunks = chunked(q), chunked(k), chunked(v)
    log_decay = F.pad(per_token_log_decay(log_decay, batch, length, starts), (0, padding))
    log_decay = log_decay.view(batch, heads, num_chunks, chunk_size)

    # Inside each chunk, from a zero state: the parallel form.
    decay = torch.exp(segment_log_decays(log_decay))  # [B, H, nc, L, L]
    scores = torch.matmul(q_chunks, k_chunks.transpose(-1, -2)) * decay.to(q.dtype)
    output = torch.matmul(scores, v_chunks).to(accumulate)

    # What each chunk adds to the state at its end: sum_s exp(g_{s+1} + ... + g_end) k_s^T v_s.
    to_end = decay[..., -1, :]
    added = torch.matmul((k_chunks * to_end[..., None].to(k.dtype)).transpose(-1, -2), v_chunks).to(accumulate)

    # The state at the end of each chunk: the chunks' additions, decayed by the chunks after them.
    within = log_decay.cumsum(-1)  # [B, H, nc, L]: how much of the chunk's starting state is left at t
    chunk_log_decay = within[..., -1]  # [B, H, nc]
    across = torch.exp(segment_log_decays(chunk_log_decay)).to(accumulate)  # [B, H, nc, nc]
    carry_in_fp32 = in_state_dtype(q.device)  # the carries stay fp32 under autocast too
    with carry_in_fp32:
        ends = torch.matmul(across, added.flatten(-2))  # [B, H, nc, Dk * Dv]
    if initial_state is None:
        initial = torch.zeros(batch, heads, key_width * value_width, device=q.device, dtype=accumulate)
    else:
        initial = initial_state.to(accumulate).flatten(-2)
        ends = ends + torch.exp(chunk_log_decay.cumsum(-1))[..., None] * initial[:, :, None]
    starts = torch.cat([initial[:, :, None], ends[:, :, :-1]], dim=2)
    starts = starts.view(batch, heads, num_chunks, key_width, value_width)

    # The state a chunk starts from reaches its token t decayed by exp(g_start + ... + g_t).
    with carry_in_fp32:
        output = output + torch.exp(within)[..., None] * torch.matmul(q_chunks.to(accumulate), starts)
    # A tensor of its own, not a view of the padded one: compiled with the length symbolic, the
    # view's strides (in chunks) and those inductor gives it (in tokens) differ, and the
    # backward's compilation would then fix the length (torch 2.13).
    output = output.view(batch, heads, num_chunks * chunk_size, value_width)[:, :, :length].contiguous()
    final = ends[:, :, -1].view(batch, heads, key_width, value_width)
    return output.to(v.dtype), final
