"""Recurrent form of the exponential filter: O(1) state per token, for decoding.

One step reads the state as the output and then absorbs the token:
``y = h;  h <- a * (h + x)`` (the paper's Eq. 19 for the decay section).
"""

from __future__ import annotations

import torch

from mcsd.ops.common import state_dtype


def exp_filter_step(
    x: torch.Tensor, log_decay: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: ``x`` ``[B, C, D]``, ``state`` ``[B, C, D]`` fp32 -> (output, new state)."""
    decay = torch.exp(log_decay.float()).to(state.dtype)[None, :, None]
    return state.to(x.dtype), decay * (state + x.to(state.dtype))


def recurrent_exp_filter(
    x: torch.Tensor, log_decay: torch.Tensor, initial_state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`parallel_exp_filter`, one token at a time (reference for decoding)."""
    batch, channels, length, width = x.shape
    accumulate = state_dtype(x)
    state = (
        torch.zeros(batch, channels, width, device=x.device, dtype=accumulate)
        if initial_state is None
        else initial_state.to(accumulate)
    )
    outputs = []
    for position in range(length):
        y, state = exp_filter_step(x[:, :, position], log_decay, state)
        outputs.append(y)
    return torch.stack(outputs, dim=2), state
