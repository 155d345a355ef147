"""The per-channel exponential filter shared by MCSD's slope and decay sections.

``y[n] = sum_{j<n} a^(n-j) x[j] + a^n h0`` for each channel's decay ``a = exp(log_decay)``,
in three forms that compute the same function: ``parallel`` (N x N matrix, the reference),
``chunk`` (intra-chunk matrix + carried state, the training default) and ``recurrent``
(one token at a time). All take an initial state and return the final state. ``kernels`` (:mod:`mcsd.ops.kernels`)
runs the chunk and recurrent forms through flash-linear-attention's HGRN kernels
(:mod:`mcsd.ops.exp_filter.fla_backend`) on a GPU.

:mod:`mcsd.ops.exp_filter.history` reads the filter at absolute positions the way MCSD's
sections do (averaged or raw, row 0 the token itself, an averaged or raw decoding state), in
every form and one token at a time: the MCSD block reaches the filter only through it.
"""

from mcsd.ops.common import FORMS
from mcsd.ops.exp_filter.chunk import chunk_exp_filter
from mcsd.ops.exp_filter.filter import exp_filter
from mcsd.ops.exp_filter.fla_backend import fla_exp_filter
from mcsd.ops.exp_filter.history import History, filter_histories, history_step, history_weight_sum
from mcsd.ops.exp_filter.parallel import decay_powers, exp_filter_matrix, parallel_exp_filter
from mcsd.ops.exp_filter.recurrent import exp_filter_step, recurrent_exp_filter

__all__ = [
    "FORMS",
    "History",
    "chunk_exp_filter",
    "decay_powers",
    "exp_filter",
    "exp_filter_matrix",
    "exp_filter_step",
    "filter_histories",
    "fla_exp_filter",
    "history_step",
    "history_weight_sum",
    "parallel_exp_filter",
    "recurrent_exp_filter",
]
