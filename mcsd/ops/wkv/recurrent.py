"""Recurrent form of RWKV-4's WKV: one token at a time with the max trick, for decoding.

State ``(a, b, p)`` ``[B, 3, D]`` fp32: numerator and denominator scaled by ``e^{-p}``.
For token ``(k, v)``: ``q = max(p, u + k)``,
``wkv = (e^{p-q} a + e^{u+k-q} v) / (e^{p-q} b + e^{u+k-q})``; then ``q' = max(p - w, k)``,
``a <- e^{p-w-q'} a + e^{k-q'} v``, ``b <- e^{p-w-q'} b + e^{k-q'}``, ``p <- q'``.
"""

from __future__ import annotations

import functools

import torch

from mcsd.ops.common import state_dtype
from mcsd.ops.context import STEP, ForwardContext
from mcsd.ops.dispatch import dispatch
from mcsd.ops.wkv.fla_backend import fla_wkv_step
from mcsd.ops.wkv.parallel import empty_wkv_state


def wkv_step(w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             state: torch.Tensor, context: ForwardContext = STEP) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: ``k``, ``v`` ``[B, D]``, ``state`` ``[B, 3, D]`` -> (``wkv [B, D]``, new state);
    through fla's fused kernel where ``context.kernels`` says so."""
    return dispatch(context, k.device, {"recurrent": functools.partial(_step, w, u, k, v, state)},
                    fla=functools.partial(fla_wkv_step, w, u, k, v, state))


def _step(w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
          state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = state.dtype
    w, u, k, v32 = w.to(dtype), u.to(dtype), k.to(dtype), v.to(dtype)
    a, b, p = state.unbind(1)
    scale = torch.maximum(p, u + k).detach()
    old, new = torch.exp(p - scale), torch.exp(u + k - scale)
    output = (old * a + new * v32) / (old * b + new)
    next_scale = torch.maximum(p - w, k).detach()
    old, new = torch.exp(p - w - next_scale), torch.exp(k - next_scale)
    return output.to(v.dtype), torch.stack([old * a + new * v32, old * b + new, next_scale], dim=1)


def recurrent_wkv(
    w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor, initial_state: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`parallel_wkv`, one token at a time (the empty state again at each
    document's start)."""
    batch, length, channels = k.shape
    empty = empty_wkv_state(batch, channels, k.device, state_dtype(v))
    state = empty if initial_state is None else initial_state.to(state_dtype(v))
    outputs = []
    for position in range(length):
        if starts is not None:
            state = torch.where(starts[:, position, None, None], empty, state)
        output, state = _step(w, u, k[:, position], v[:, position], state)
        outputs.append(output)
    return torch.stack(outputs, dim=1), state
