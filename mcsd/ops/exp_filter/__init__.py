"""The per-channel exponential filter shared by MCSD's slope and decay sections.

``y[n] = sum_{j<n} a^(n-j) x[j] + a^n h0`` for each channel's decay ``a = exp(log_decay)``,
in three forms that compute the same function: ``parallel`` (N x N matrix, the reference),
``chunk`` (intra-chunk matrix + carried state, the training default) and ``recurrent``
(one token at a time). All take an initial state and return the final state. ``kernels`` (:mod:`mcsd.ops.kernels`)
runs the chunk and recurrent forms through flash-linear-attention's HGRN kernels
(:mod:`mcsd.ops.exp_filter.fla_backend`) on a GPU.
"""

from __future__ import annotations

import functools

import torch

from mcsd.ops.common import FORMS
from mcsd.ops.dispatch import dispatch
from mcsd.ops.exp_filter.chunk import chunk_exp_filter
from mcsd.ops.exp_filter.fla_backend import fla_exp_filter
from mcsd.ops.exp_filter.parallel import decay_powers, exp_filter_matrix, parallel_exp_filter
from mcsd.ops.exp_filter.recurrent import exp_filter_step, recurrent_exp_filter


def exp_filter(
    x: torch.Tensor,
    log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    form: str = "chunk",
    chunk_size: int = 64,
    kernels: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch to one form (and to fla's kernel for it where ``kernels`` says so); returns
    ``(output [B, C, N, D], final_state [B, C, D] fp32)``."""
    return dispatch(form, kernels, x.device, {
        "parallel": functools.partial(parallel_exp_filter, x, log_decay, initial_state),
        "chunk": functools.partial(chunk_exp_filter, x, log_decay, initial_state, chunk_size),
        "recurrent": functools.partial(recurrent_exp_filter, x, log_decay, initial_state),
    }, fla=functools.partial(fla_exp_filter, x, log_decay, initial_state, form))


__all__ = [
    "FORMS",
    "chunk_exp_filter",
    "decay_powers",
    "exp_filter",
    "exp_filter_matrix",
    "exp_filter_step",
    "fla_exp_filter",
    "parallel_exp_filter",
    "recurrent_exp_filter",
]
