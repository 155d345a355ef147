"""Recurrent form of gated linear attention: one token at a time, for decoding.

``S <- diag(exp(g)) S + k^T v;  o = q S`` with an fp32 state ``[B, H, Dk, Dv]``.
"""

from __future__ import annotations

import functools

import torch

from mcsd.ops.common import state_dtype
from mcsd.ops.context import STEP, ForwardContext
from mcsd.ops.dispatch import dispatch
from mcsd.ops.gla.fla_backend import fla_gla_step
from mcsd.ops.gla.parallel import key_log_decay


def gla_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, state: torch.Tensor,
    context: ForwardContext = STEP,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: ``q``, ``k``, ``log_decay`` ``[B, H, Dk]``, ``v`` ``[B, H, Dv]``, ``state``
    ``[B, H, Dk, Dv]`` -> (output ``[B, H, Dv]``, new state); through fla's fused recurrent
    kernel where ``context.kernels`` says so."""
    return dispatch(context, q.device, {"recurrent": functools.partial(_step, q, k, v, log_decay, state)},
                    fla=functools.partial(fla_gla_step, q, k, v, log_decay, state))


def _step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    decay = torch.exp(log_decay.to(state.dtype))[..., None]
    state = decay * state + k.to(state.dtype)[..., :, None] * v.to(state.dtype)[..., None, :]
    return torch.einsum("bhk,bhkv->bhv", q.to(state.dtype), state).to(v.dtype), state


def recurrent_gla(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`~mcsd.ops.gla.parallel.parallel_gla`, one token at a time."""
    batch, heads, length, key_width = q.shape
    log_decay = key_log_decay(log_decay, starts)
    state = (torch.zeros(batch, heads, key_width, v.shape[-1], device=q.device, dtype=state_dtype(v))
             if initial_state is None else initial_state.to(state_dtype(v)))
    outputs = []
    for position in range(length):
        output, state = _step(q[:, :, position], k[:, :, position], v[:, :, position], log_decay[:, :, position], state)
        outputs.append(output)
    return torch.stack(outputs, dim=2), state
