"""The gated delta rule (Gated DeltaNet, Yang, Kautz and Hatamizadeh 2025):
``S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T`` (written here with ``S``
keys-to-values, ``[B, H, Dk, Dv]``), ``o_t = q_t S_t``: a decay per token and head, then a write
that replaces what ``k_t`` reads by ``beta_t`` of the way to ``v_t``. ``g = 0`` is DeltaNet's delta
rule (Yang et al. 2024).

Three forms of one function: ``recurrent`` (token by token: the reference and the decoding
step), ``chunk`` (the UT transform, solved per chunk as a triangular system: the training form)
and ``parallel`` (that system over the whole sequence), each with an initial and a final state
(fp32) and documents apart; ``context.kernels`` runs the chunk and recurrent forms and the step
through fla's ``chunk_gated_delta_rule`` and ``fused_recurrent_gated_delta_rule`` on a GPU
(:mod:`mcsd.ops.delta_rule.fla_backend`).
"""

from __future__ import annotations

import functools

import torch

from mcsd.ops.common import FORMS
from mcsd.ops.context import CHUNK, ForwardContext
from mcsd.ops.delta_rule.chunk import chunk_delta_rule, parallel_delta_rule
from mcsd.ops.delta_rule.fla_backend import fla_delta_rule
from mcsd.ops.delta_rule.recurrent import delta_rule_step, recurrent_delta_rule
from mcsd.ops.dispatch import dispatch
from mcsd.ops.kernels import odd_width_problem


def delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, context: ForwardContext = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch to ``context``'s form (and to fla's kernel for it where ``context.kernels`` says
    so); returns ``(output [B, H, N, Dv], final_state [B, H, Dk, Dv] fp32)``, the documents of a
    packed batch apart where ``context.starts`` says they start."""
    inputs, starts = (q, k, v, beta, log_decay, initial_state), context.starts
    return dispatch(context, q.device, {
        "parallel": functools.partial(parallel_delta_rule, *inputs, starts),
        "chunk": functools.partial(chunk_delta_rule, *inputs, context.chunk_size, starts),
        "recurrent": functools.partial(recurrent_delta_rule, *inputs, starts),
    }, fla=functools.partial(fla_delta_rule, *inputs, context.form, starts=starts),
        fla_problem=lambda: odd_width_problem(q, v, context.form))


__all__ = ["FORMS", "chunk_delta_rule", "delta_rule", "delta_rule_step", "fla_delta_rule", "parallel_delta_rule",
           "recurrent_delta_rule"]
