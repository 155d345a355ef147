"""The exponential filter through flash-linear-attention's HGRN kernels (``chunk_hgrn``,
``fused_recurrent_hgrn``): ``h_t = exp(g_t) h_{t-1} + x_t``, output ``h_t``.

fla's recurrence is inclusive (token ``t`` is in ``h_t``), ours strictly causal:
``y_n = sum_{j<n} a^(n-j) x_j + a^n h0 = a * h_{n-1}`` where ``h`` is fla's recurrence over
``x`` started from ``h0 / a``. So the adapter shifts fla's output one token later, scales it
by ``a`` (in fp32), puts ``h0`` at position 0, and takes ``a * h_{N-1}`` as the final state.
Channels and their features are flattened onto fla's feature axis (``[B, N, C * D]``: a view
when ``x`` is a channels-first view of ``[B, N, C, D]``, as the MCSD block hands it), with the
per-channel ``log(a)`` repeated over each channel's features as fla's per-token gate ``g``.

Cost: fla's kernels read a gate per token and feature, so the per-channel decay is handed over
as an fp32 ``[B, N, C * D]`` tensor (its kernels make an expanded one contiguous), written once
and kept for the backward: at a 16-bit model, twice the bytes of the filter's input.

Documents apart (``starts``): fla's gate is ``-inf`` at each document's first token, so that
``exp(g) = 0`` drops the state there and fla's ``h`` restarts from that token; the shifted output
is 0 at a start (no history) and the final state holds the row's last document alone. Exact in
both kernels: each multiplies by ``exp`` of a gate or of a running sum of gates (``exp(-inf) = 0``)
and neither subtracts one sum from another (no ``inf - inf``), forward or backward.

Precision: fla's chunk kernel accumulates in fp32 and returns its final state in fp32; its
fused recurrence returns the state in the input's dtype, so the recurrent form hands it fp32
input. Gradients reach ``x``; fla's ``chunk_hgrn`` passes none to an initial state (training
starts from none).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from mcsd.ops.common import state_dtype
from mcsd.ops.kernels import fla_kernel, outside_compiled_graphs


@outside_compiled_graphs
def fla_exp_filter(
    x: torch.Tensor, log_decay: torch.Tensor, initial_state: torch.Tensor | None = None,
    form: str = "chunk", kernel: Callable | None = None, starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mcsd.ops.exp_filter.exp_filter`'s contract through fla's ``form`` kernel (or
    ``kernel``, a function with fla's HGRN signature: its naive reference in the CPU tests),
    ``starts`` ``[B, N]`` bool where the documents of a packed batch start."""
    kernel = kernel if kernel is not None else fla_kernel("exp_filter", form)
    batch, channels, length, width = x.shape
    accumulate = state_dtype(x)
    features = x.transpose(1, 2).reshape(batch, length, channels * width)
    if form == "recurrent":
        features = features.to(accumulate)
    log_decay = log_decay.to(accumulate).repeat_interleave(width)  # [C * D]
    decay = torch.exp(log_decay)
    start = None if initial_state is None else initial_state.to(accumulate).reshape(batch, -1) / decay
    gate = log_decay.expand(batch, length, -1)
    if starts is not None:
        gate = gate.masked_fill(starts[:, :, None], float("-inf"))
    inclusive, final = kernel(features, gate, start, True)
    output = F.pad(inclusive[:, :-1], (0, 0, 1, 0)).to(accumulate) * decay
    if initial_state is not None:
        output[:, 0] = initial_state.to(accumulate).reshape(batch, -1)
    if starts is not None:
        output = output.masked_fill(starts[:, :, None], 0.0)
    output = output.to(x.dtype).view(batch, length, channels, width).transpose(1, 2)
    return output, (final.to(accumulate) * decay).view(batch, channels, width)
