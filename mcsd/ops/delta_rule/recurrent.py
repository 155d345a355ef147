"""Recurrent form of the gated delta rule: one token at a time, the reference and the decoding step.

With the state ``S`` ``[B, H, Dk, Dv]`` fp32 (keys to values), per token: decay, then replace
what the key reads by ``beta`` of the way to the new value,

    S' = exp(g) S;   u = beta (v - k^T S');   S <- S' + k u^T;   o = q^T S,

which is Gated DeltaNet's ``S_t = a_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T`` written with
``S`` transposed (Yang, Kautz and Hatamizadeh 2025); ``g = 0`` is DeltaNet's delta rule.
"""

from __future__ import annotations

import functools

import torch

from mcsd.ops.common import state_dtype
from mcsd.ops.context import STEP, ForwardContext
from mcsd.ops.delta_rule.fla_backend import fla_delta_rule_step
from mcsd.ops.dispatch import dispatch


def delta_rule_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, log_decay: torch.Tensor,
    state: torch.Tensor, context: ForwardContext = STEP,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: ``q``, ``k`` ``[B, H, Dk]``, ``v`` ``[B, H, Dv]``, ``beta`` and ``log_decay``
    ``[B, H]``, ``state`` ``[B, H, Dk, Dv]`` -> (output ``[B, H, Dv]``, new state); through fla's
    fused recurrent kernel where ``context.kernels`` says so."""
    return dispatch(context, q.device, {"recurrent": functools.partial(_step, q, k, v, beta, log_decay, state)},
                    fla=functools.partial(fla_delta_rule_step, q, k, v, beta, log_decay, state))


def _step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, log_decay: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    accumulate, output_dtype = state.dtype, v.dtype
    k, v = k.to(accumulate), v.to(accumulate)
    decayed = torch.exp(log_decay.to(accumulate))[..., None, None] * state
    written = beta.to(accumulate)[..., None] * (v - torch.einsum("bhk,bhkv->bhv", k, decayed))
    state = decayed + k[..., :, None] * written[..., None, :]
    return torch.einsum("bhk,bhkv->bhv", q.to(accumulate), state).to(output_dtype), state


def recurrent_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q``, ``k`` ``[B, H, N, Dk]``, ``v`` ``[B, H, N, Dv]``, ``beta`` and ``log_decay``
    ``[B, H, N]``, ``initial_state`` ``[B, H, Dk, Dv]``, ``starts`` ``[B, N]`` bool (documents
    apart: the log-decay is -inf at a start, so the state before it is dropped). Returns the
    output ``[B, H, N, Dv]`` (dtype of ``v``) and the final state (fp32; the last document's)."""
    batch, heads, length, key_width = q.shape
    if starts is not None:
        log_decay = log_decay.masked_fill(starts[:, None, :], float("-inf"))
    state = (torch.zeros(batch, heads, key_width, v.shape[-1], device=q.device, dtype=state_dtype(v))
             if initial_state is None else initial_state.to(state_dtype(v)))
    outputs = []
    for position in range(length):
        output, state = _step(q[:, :, position], k[:, :, position], v[:, :, position], beta[:, :, position],
                              log_decay[:, :, position], state)
        outputs.append(output)
    return torch.stack(outputs, dim=2).to(v.dtype), state
