"""Chunkwise form of RWKV-4's WKV: the parallel form inside chunks of ``chunk_size`` tokens,
the state ``(a, b, p)`` carried from one chunk to the next (it enters each chunk as one
extra logit ``p - tau w``). Memory ``O(C^2 D)`` per chunk instead of ``O(N^2 D)``."""

from __future__ import annotations

import torch

from mcsd.ops.wkv.naive import parallel_wkv


def chunk_wkv(
    w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    initial_state: torch.Tensor | None = None, chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`parallel_wkv`."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size}: give a positive number of tokens per chunk")
    state, outputs = initial_state, []
    for start in range(0, k.shape[1], chunk_size):
        output, state = parallel_wkv(w, u, k[:, start:start + chunk_size], v[:, start:start + chunk_size], state)
        outputs.append(output)
    return torch.cat(outputs, dim=1), state
