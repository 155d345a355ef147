"""Chunkwise form of the exponential filter: the training default.

The sequence is cut into chunks of ``chunk_size``. Inside a chunk the filter is one
``[L, L]`` matrix product; across chunks it carries a ``[B, C, D]`` state. The carry is
itself computed for all chunks at once, with a small ``[nc, nc]`` matrix of powers
``a^(L (c-1-c'))``, so there is no Python loop over tokens or chunks. Every power is
``a^k`` with ``k >= 0`` (masked to -inf before ``exp`` otherwise): nothing overflows.

The sequence is zero-padded to a multiple of ``L`` with at least one extra position, so
the final state is simply the output at position ``N`` (outputs are strictly causal).

Documents apart (``starts``), exactly, as Mamba-2's ``seq_idx`` does: each position's document
index (:func:`mcsd.ops.common.document_index`) masks the intra-chunk matrix to pairs of one
document; a chunk's contribution to the state at its end keeps the tokens of the document open
there; a carry from chunk ``c'`` reaches chunk ``c`` only if no document starts between them; the
state at a chunk's start reaches only its tokens before the chunk's first start. The padding
belongs to the last document, so the final state is the last document's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mcsd.ops.common import document_index, in_state_dtype
from mcsd.ops.exp_filter.parallel import (
    decay_powers,
    exp_filter_matrix,
    masked_powers,
    state_dtype,
)


def chunk_exp_filter(
    x: torch.Tensor,
    log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
    starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`parallel_exp_filter`, O(N * chunk_size) time and memory."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be a positive integer")
    batch, channels, length, width = x.shape
    accumulate = state_dtype(x)
    num_chunks = length // chunk_size + 1
    padded = F.pad(x, (0, 0, 0, num_chunks * chunk_size - length))
    chunks = padded.view(batch, channels, num_chunks, chunk_size, width)

    if starts is not None:
        index = document_index(starts, num_chunks * chunk_size).view(batch, num_chunks, chunk_size)
        ends = index[:, :, -1]  # [B, nc]: the document open at each chunk's end
        before = F.pad(ends, (1, 0))[:, :-1]  # ... and at its start (0: the initial state's)

    # Within a chunk: y[t] = sum_{s<t} a^(t-s) x[s].
    intra = exp_filter_matrix(log_decay, chunk_size).to(x.dtype)  # [C, L, L]
    if starts is None:
        y = torch.matmul(intra[None, :, None], chunks).to(accumulate)
    else:  # pairs of one document: [B, C, nc, L, L]
        same = (index[:, :, :, None] == index[:, :, None, :]).to(x.dtype)
        y = torch.matmul(intra[None, :, None] * same[:, None], chunks).to(accumulate)

    # Each chunk's own contribution to the state at its end: sum_s a^(L-s) x[s].
    to_end = decay_powers(log_decay, chunk_size + 1).flip(-1)[:, :chunk_size]  # a^(L-s)
    if starts is None:
        local = torch.einsum("cs,bcnsd->bcnd", to_end.to(x.dtype), chunks).to(accumulate)
    else:  # the tokens of the document open at the chunk's end
        open_at_end = (index == ends[:, :, None]).to(x.dtype)  # [B, nc, L]
        local = torch.einsum("cs,bns,bcnsd->bcnd", to_end.to(x.dtype), open_at_end, chunks).to(accumulate)

    # State at the start of chunk c: sum_{c'<c} a^(L(c-1-c')) local[c'] + a^(Lc) h0.
    chunk_log_decay = log_decay.float() * chunk_size
    chunk_index = torch.arange(num_chunks, device=x.device)
    distance = chunk_index[:, None] - chunk_index[None, :] - 1
    # Channels last, [nc, nc, C]: no stride of nc^2, on which inductor's value ranges fail when
    # nc is symbolic (torch 2.13; a product's backward reads the matrix transposed).
    carry = masked_powers(chunk_log_decay, distance, keep=distance >= 0).permute(1, 2, 0).contiguous()
    with in_state_dtype(x.device):  # the carry stays fp32 under autocast too
        if starts is None:
            chunk_starts = torch.einsum("ijc,bcjd->bcid", carry.to(accumulate), local)  # [B, C, nc, D]
        else:  # from c' to c only within one document: [B, nc, nc, C]
            unbroken = (ends[:, None, :] == before[:, :, None]).to(accumulate)
            chunk_starts = torch.einsum("bijc,bcjd->bcid", carry.to(accumulate)[None] * unbroken[..., None], local)
    if initial_state is not None:
        to_start = decay_powers(chunk_log_decay, num_chunks).to(accumulate)[None, :, :, None]  # [1, C, nc, 1]
        if starts is not None:
            to_start = to_start * (before == 0)[:, None, :, None]
        chunk_starts = chunk_starts + to_start * initial_state.to(accumulate)[:, :, None, :]

    # Inside chunk c the carried state reaches position t as a^t * start[c] (t of its document).
    from_start = decay_powers(log_decay, chunk_size).to(accumulate)[None, :, None, :, None]  # a^t
    if starts is not None:
        from_start = from_start * (index == before[:, :, None])[:, None, :, :, None]
    y = y + from_start * chunk_starts[:, :, :, None, :]
    y = y.reshape(batch, channels, num_chunks * chunk_size, width)
    return y[:, :, :length].to(x.dtype), y[:, :, length : length + 1].squeeze(2).clone()  # a state of its own
