"""Chunkwise form of the exponential filter: the training default.

The sequence is cut into chunks of ``chunk_size``. Inside a chunk the filter is one
``[L, L]`` matrix product; across chunks it carries a ``[B, C, D]`` state. The carry is
itself computed for all chunks at once, with a small ``[nc, nc]`` matrix of powers
``a^(L (c-1-c'))``, so there is no Python loop over tokens or chunks. Every power is
``a^k`` with ``k >= 0`` (masked to -inf before ``exp`` otherwise): nothing overflows.

The sequence is zero-padded to a multiple of ``L`` with at least one extra position, so
the final state is simply the output at position ``N`` (outputs are strictly causal).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mcsd.ops.common import in_state_dtype
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`parallel_exp_filter`, O(N * chunk_size) time and memory."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be a positive integer")
    batch, channels, length, width = x.shape
    accumulate = state_dtype(x)
    num_chunks = length // chunk_size + 1
    padded = F.pad(x, (0, 0, 0, num_chunks * chunk_size - length))
    chunks = padded.view(batch, channels, num_chunks, chunk_size, width)

    # Within a chunk: y[t] = sum_{s<t} a^(t-s) x[s].
    intra = exp_filter_matrix(log_decay, chunk_size).to(x.dtype)  # [C, L, L]
    y = torch.matmul(intra[None, :, None], chunks).to(accumulate)

    # Each chunk's own contribution to the state at its end: sum_s a^(L-s) x[s].
    to_end = decay_powers(log_decay, chunk_size + 1).flip(-1)[:, :chunk_size]  # a^(L-s)
    local = torch.einsum("cs,bcnsd->bcnd", to_end.to(x.dtype), chunks).to(accumulate)

    # State at the start of chunk c: sum_{c'<c} a^(L(c-1-c')) local[c'] + a^(Lc) h0.
    chunk_log_decay = log_decay.float() * chunk_size
    chunk_index = torch.arange(num_chunks, device=x.device)
    distance = chunk_index[:, None] - chunk_index[None, :] - 1
    # Channels last, [nc, nc, C]: no stride of nc^2, on which inductor's value ranges fail when
    # nc is symbolic (torch 2.13; a product's backward reads the matrix transposed).
    carry = masked_powers(chunk_log_decay, distance, keep=distance >= 0).permute(1, 2, 0).contiguous()
    with in_state_dtype(x.device):  # the carry stays fp32 under autocast too
        starts = torch.einsum("ijc,bcjd->bcid", carry.to(accumulate), local)  # [B, C, nc, D]
    if initial_state is not None:
        to_start = decay_powers(chunk_log_decay, num_chunks).to(accumulate)
        starts = starts + to_start[None, :, :, None] * initial_state.to(accumulate)[:, :, None, :]

    # Inside chunk c the carried state reaches position t as a^t * start[c].
    from_start = decay_powers(log_decay, chunk_size).to(accumulate)  # a^t
    y = y + from_start[None, :, None, :, None] * starts[:, :, :, None, :]
    y = y.reshape(batch, channels, num_chunks * chunk_size, width)
    return y[:, :, :length].to(x.dtype), y[:, :, length : length + 1].squeeze(2).clone()  # a state of its own
