"""Decayed linear attention through flash-linear-attention's simple GLA kernels
(``chunk_simple_gla``, ``fused_recurrent_simple_gla``): ``S_t = exp(g_t) S_{t-1} + k_t^T v_t``,
``o_t = scale * q_t S_t`` with a per-head log-decay ``g`` ``[B, T, H]``: ours exactly, with
``scale = 1`` (the callers scale their keys), the heads moved behind the positions
(``[B, T, H, D]``: a view when the caller's ``[B, H, N, D]`` is one of ``[B, N, H, D]``) and a
per-head constant decay broadcast over the batch and the positions. States are fp32
``[B, H, Dk, Dv]`` on both sides.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mcsd.ops.common import state_dtype
from mcsd.ops.decayed_attention.naive import per_token_log_decay
from mcsd.ops.kernels import fla_kernel


def fla_decayed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, form: str = "chunk", kernel: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mcsd.ops.decayed_attention.decayed_attention`'s contract through fla's ``form``
    kernel (or ``kernel``, a function with fla's simple GLA keywords: its naive references in
    the CPU tests)."""
    kernel = kernel if kernel is not None else fla_kernel("decayed_attention", form)
    batch, _, length, _ = q.shape
    accumulate = state_dtype(v)
    g = per_token_log_decay(log_decay, batch, length).transpose(1, 2)  # [B, N, H]
    output, final = kernel(q=q.transpose(1, 2), k=k.transpose(1, 2), v=v.transpose(1, 2), g=g, scale=1.0,
                           initial_state=None if initial_state is None else initial_state.to(accumulate),
                           output_final_state=True)
    return output.transpose(1, 2).to(v.dtype), final.to(accumulate)


def fla_decayed_attention_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, state: torch.Tensor,
    kernel: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token (:func:`mcsd.ops.decayed_attention.decayed_attention_step`'s contract) through
    fla's fused recurrent kernel: one launch for the state's update and read."""
    output, state = fla_decayed_attention(q[:, :, None], k[:, :, None], v[:, :, None], log_decay[..., None], state,
                                          form="recurrent", kernel=kernel)
    return output[:, :, 0], state
