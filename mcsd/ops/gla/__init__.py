"""Gated linear attention (GLA, Yang et al. 2024): ``S_n = diag(exp(g_n)) S_{n-1} + k_n^T v_n``,
``o_n = q_n S_n`` with a log-decay per token and per key channel ``g`` ``[B, H, N, Dk]``.

Decayed linear attention (:mod:`mcsd.ops.decayed_attention`: one decay per head or per token)
is its case of equal channels; an op of its own, as fla keeps ``gla`` beside ``simple_gla``,
because every form needs a key axis on its decays that the per-head op would pay for too
(``[N, N, Dk]`` decays instead of ``[N, N]``). Three forms of one function: ``parallel`` (the
reference), ``chunk`` (the training form) and ``recurrent``, each with an initial and a final
state (fp32) and documents apart; ``context.kernels`` runs the chunk and recurrent forms and the
step through fla's ``chunk_gla`` and ``fused_recurrent_gla`` on a GPU
(:mod:`mcsd.ops.gla.fla_backend`).
"""

from __future__ import annotations

import functools

import torch

from mcsd.ops.common import FORMS
from mcsd.ops.context import CHUNK, ForwardContext
from mcsd.ops.dispatch import dispatch
from mcsd.ops.kernels import odd_width_problem
from mcsd.ops.gla.chunk import chunk_gla
from mcsd.ops.gla.fla_backend import fla_gla
from mcsd.ops.gla.parallel import key_segment_log_decays, parallel_gla
from mcsd.ops.gla.recurrent import gla_step, recurrent_gla


def gla(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, context: ForwardContext = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch to ``context``'s form (and to fla's kernel for it where ``context.kernels`` says
    so); returns ``(output [B, H, N, Dv], final_state [B, H, Dk, Dv] fp32)``, the documents of a
    packed batch apart where ``context.starts`` says they start."""
    inputs, starts = (q, k, v, log_decay, initial_state), context.starts
    return dispatch(context, q.device, {
        "parallel": functools.partial(parallel_gla, *inputs, starts),
        "chunk": functools.partial(chunk_gla, *inputs, context.chunk_size, starts),
        "recurrent": functools.partial(recurrent_gla, *inputs, starts),
    }, fla=functools.partial(fla_gla, *inputs, context.form, starts=starts),
        fla_problem=lambda: odd_width_problem(q, v, context.form))


__all__ = ["FORMS", "chunk_gla", "fla_gla", "gla", "gla_step", "key_segment_log_decays", "parallel_gla", "recurrent_gla"]
