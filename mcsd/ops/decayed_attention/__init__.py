"""Decayed linear attention: ``S_n = exp(g_n) S_{n-1} + k_n^T v_n``, ``o_n = q_n S_n``.

RetNet's retention (a constant log-decay per head) and, with a per-token log-decay, the
state-space duality of Mamba-2 (SSD), in three forms that compute the same function:
``parallel`` (N x N decay matrix, the reference), ``chunk`` (parallel inside chunks, a
carried state across them: the training form) and ``recurrent`` (one token at a time).
All take an initial state and return the final state, fp32, with decays in log-space.
MCSD's decay section is its special case ``Dk = 1``, ``q = k = 1`` without the diagonal:
``exp_filter(x) = decayed_attention(1, 1, x) - x``. ``context.kernels`` (:mod:`mcsd.ops.kernels`)
runs the chunk and recurrent forms and the decoding step through flash-linear-attention's simple GLA
kernels (:mod:`mcsd.ops.decayed_attention.fla_backend`) on a GPU.
"""

from __future__ import annotations

import functools

import torch

from mcsd.ops.common import FORMS
from mcsd.ops.context import CHUNK, ForwardContext
from mcsd.ops.decayed_attention.chunk import chunk_decayed_attention
from mcsd.ops.decayed_attention.fla_backend import fla_decayed_attention, fla_problem
from mcsd.ops.common import segment_log_decays
from mcsd.ops.decayed_attention.parallel import parallel_decayed_attention, per_token_log_decay
from mcsd.ops.decayed_attention.recurrent import decayed_attention_step, recurrent_decayed_attention
from mcsd.ops.dispatch import dispatch


def decayed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, context: ForwardContext = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch to ``context``'s form (and to fla's kernel for it where ``context.kernels`` says
    so); returns ``(output [B, H, N, Dv], final_state [B, H, Dk, Dv] fp32)``, the documents of a
    packed batch apart where ``context.starts`` says they start."""
    inputs, starts = (q, k, v, log_decay, initial_state), context.starts
    return dispatch(context, q.device, {
        "parallel": functools.partial(parallel_decayed_attention, *inputs, starts),
        "chunk": functools.partial(chunk_decayed_attention, *inputs, context.chunk_size, starts),
        "recurrent": functools.partial(recurrent_decayed_attention, *inputs, starts),
    }, fla=functools.partial(fla_decayed_attention, *inputs, context.form, starts=starts),
        fla_problem=lambda: fla_problem(q, k, v, log_decay, context.form))


__all__ = [
    "FORMS",
    "chunk_decayed_attention",
    "decayed_attention",
    "decayed_attention_step",
    "fla_decayed_attention",
    "parallel_decayed_attention",
    "per_token_log_decay",
    "recurrent_decayed_attention",
    "segment_log_decays",
]
