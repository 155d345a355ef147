"""The gated delta rule through flash-linear-attention's kernels (``chunk_gated_delta_rule``,
``fused_recurrent_gated_delta_rule``): ``S_t = exp(g_t) S_{t-1}``, then the delta update with
``beta_t``, ``o_t = scale * q_t S_t``: ours exactly, with ``scale = 1`` (the callers scale their
queries), the heads moved behind the positions (``[B, T, H, D]``), ``g`` and ``beta``
``[B, T, H]``, fp32 states ``[B, H, Dk, Dv]``. The kernels' own L2 norm and sigmoid of beta are
left off: the mixer computes both.

Documents apart (``starts``): fla's variable-length sequences (:mod:`mcsd.ops.varlen`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mcsd.ops.common import state_dtype
from mcsd.ops.kernels import fla_kernel, outside_compiled_graphs
from mcsd.ops.varlen import document_pieces


@outside_compiled_graphs
def fla_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, form: str = "chunk", kernel: Callable | None = None,
    starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mcsd.ops.delta_rule.delta_rule`'s contract through fla's ``form`` kernel (or
    ``kernel``, a function with fla's keywords: its naive references in the CPU tests)."""
    kernel = kernel if kernel is not None else fla_kernel("delta_rule", form)
    batch, heads, length, _ = q.shape
    accumulate = state_dtype(v)
    g, beta = (x.to(accumulate).transpose(1, 2) for x in (log_decay, beta))  # [B, N, H]
    q, k, v = (tensor.transpose(1, 2) for tensor in (q.to(v.dtype), k.to(v.dtype), v))  # [B, N, H, D]
    initial_state = None if initial_state is None else initial_state.to(accumulate)
    if starts is None:
        output, final = kernel(q=q, k=k, v=v, g=g, beta=beta, scale=1.0, initial_state=initial_state,
                               output_final_state=True)
        return output.transpose(1, 2).to(v.dtype), final.to(accumulate)
    pieces = document_pieces(starts, initial_state, heads, q.shape[-1], v.shape[-1], accumulate)
    flat = [tensor.reshape(1, batch * length, heads, -1) for tensor in (q, k, v)]
    output, finals = kernel(q=flat[0], k=flat[1], v=flat[2], g=g.reshape(1, batch * length, heads),
                            beta=beta.reshape(1, batch * length, heads), scale=1.0, initial_state=pieces.initial,
                            output_final_state=True, cu_seqlens=pieces.cu_seqlens)
    return output.reshape(batch, length, heads, -1).transpose(1, 2).to(v.dtype), finals[pieces.row_last].to(accumulate)


def fla_delta_rule_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, log_decay: torch.Tensor,
    state: torch.Tensor, kernel: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token (:func:`mcsd.ops.delta_rule.delta_rule_step`'s contract) through fla's fused recurrence."""
    output, state = fla_delta_rule(q[:, :, None], k[:, :, None], v[:, :, None], beta[..., None], log_decay[..., None],
                                   state, form="recurrent", kernel=kernel)
    return output[:, :, 0], state
