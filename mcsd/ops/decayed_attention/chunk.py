"""Chunkwise form of decayed linear attention: the training form (RetNet's Eq. 7).

The sequence is cut into chunks of ``chunk_size``; each chunk is the parallel form over its
own tokens (its cumulative log-decay restarts at the chunk, so exponents stay small) started
from the state carried out of the previous chunk. O(N * chunk_size) time and memory.
"""

from __future__ import annotations

import torch

from mcsd.ops.decayed_attention.naive import parallel_decayed_attention, per_token_log_decay


def chunk_decayed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`parallel_decayed_attention`."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be a positive integer")
    batch, _, length, _ = q.shape
    log_decay = per_token_log_decay(log_decay, batch, length)
    state, outputs = initial_state, []
    for start in range(0, length, chunk_size):
        part = slice(start, start + chunk_size)
        output, state = parallel_decayed_attention(q[:, :, part], k[:, :, part], v[:, :, part],
                                                   log_decay[:, :, part], state)
        outputs.append(output)
    return torch.cat(outputs, dim=2), state
