"""Recurrent form of the exponential filter: O(1) state per token, for decoding.

One step reads the state as the output and then absorbs the token:
``y = h;  h <- a * (h + x)`` (the paper's Eq. 19 for the decay section). Decoding advances its
states in place (:func:`absorb_sum_`, and :func:`absorb_average_` for a state kept as the
running average, Eq. 16): a step replayed at fixed addresses keeps them where they are.
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


def absorb_sum_(state: torch.Tensor, x: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """``state <- decay * (state + x)`` in place (Eq. 19), ``decay`` broadcast over ``state``."""
    return state.add_(x.to(state.dtype)).mul_(decay)


def absorb_average_(state: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``state <- state + (x - state) * weight`` in place: a running average with this token's
    ``weight`` (Eq. 16's convex update, ``weight = 1 / sum_{k=0}^{n} a^k``)."""
    return state.add_((x.float() - state).mul_(weight))


def recurrent_exp_filter(
    x: torch.Tensor, log_decay: torch.Tensor, initial_state: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`parallel_exp_filter`, one token at a time (reference for decoding):
    the state is set to zero before each document's start."""
    batch, channels, length, width = x.shape
    accumulate = state_dtype(x)
    state = (
        torch.zeros(batch, channels, width, device=x.device, dtype=accumulate)
        if initial_state is None
        else initial_state.to(accumulate)
    )
    outputs = []
    for position in range(length):
        if starts is not None:
            state = state * ~starts[:, position, None, None]
        y, state = exp_filter_step(x[:, :, position], log_decay, state)
        outputs.append(y)
    return torch.stack(outputs, dim=2), state
