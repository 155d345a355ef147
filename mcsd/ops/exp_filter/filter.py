"""The exponential filter in the form asked for: one of its three PyTorch forms, or fla's HGRN
kernel for it where ``kernels`` says so (:mod:`mcsd.ops.dispatch`)."""

from __future__ import annotations

import functools

import torch

from mcsd.ops.dispatch import dispatch
from mcsd.ops.exp_filter.chunk import chunk_exp_filter
from mcsd.ops.exp_filter.fla_backend import fla_exp_filter
from mcsd.ops.exp_filter.parallel import parallel_exp_filter
from mcsd.ops.exp_filter.recurrent import recurrent_exp_filter


def exp_filter(
    x: torch.Tensor,
    log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    form: str = "chunk",
    chunk_size: int = 64,
    kernels: str = "torch",
    starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch to one form (and to fla's kernel for it where ``kernels`` says so); returns
    ``(output [B, C, N, D], final_state [B, C, D] fp32)``. ``starts`` ``[B, N]`` bool: where the
    documents of a packed batch start."""
    return dispatch(form, kernels, x.device, {
        "parallel": functools.partial(parallel_exp_filter, x, log_decay, initial_state, starts),
        "chunk": functools.partial(chunk_exp_filter, x, log_decay, initial_state, chunk_size, starts),
        "recurrent": functools.partial(recurrent_exp_filter, x, log_decay, initial_state, starts),
    }, fla=functools.partial(fla_exp_filter, x, log_decay, initial_state, form, starts=starts))
