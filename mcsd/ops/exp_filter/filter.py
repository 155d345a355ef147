"""The exponential filter in the form asked for: one of its three PyTorch forms, or fla's HGRN
kernel for it where ``context.kernels`` says so (:mod:`mcsd.ops.dispatch`)."""

from __future__ import annotations

import functools

import torch

from mcsd.ops.context import CHUNK, ForwardContext
from mcsd.ops.dispatch import dispatch
from mcsd.ops.exp_filter.chunk import chunk_exp_filter
from mcsd.ops.exp_filter.fla_backend import fla_exp_filter
from mcsd.ops.exp_filter.parallel import parallel_exp_filter
from mcsd.ops.exp_filter.recurrent import recurrent_exp_filter


def exp_filter(
    x: torch.Tensor, log_decay: torch.Tensor, initial_state: torch.Tensor | None = None,
    context: ForwardContext = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch to ``context``'s form (and to fla's kernel for it where ``context.kernels`` says
    so); returns ``(output [B, C, N, D], final_state [B, C, D] fp32)``, the documents of a packed
    batch apart where ``context.starts`` says they start."""
    starts = context.starts
    return dispatch(context, x.device, {
        "parallel": functools.partial(parallel_exp_filter, x, log_decay, initial_state, starts),
        "chunk": functools.partial(chunk_exp_filter, x, log_decay, initial_state, context.chunk_size, starts),
        "recurrent": functools.partial(recurrent_exp_filter, x, log_decay, initial_state, starts),
    }, fla=functools.partial(fla_exp_filter, x, log_decay, initial_state, context.form, starts=starts))
