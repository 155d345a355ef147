"""Gated linear attention through flash-linear-attention's GLA kernels (``chunk_gla``,
``fused_recurrent_gla``): ``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t``, ``o_t = scale * q_t S_t``
with a per-key-channel log-decay ``[B, T, H, K]`` (``g`` for the chunk kernel, ``gk`` for the
fused recurrence): ours exactly, with ``scale = 1`` (the callers scale their queries) and the
heads moved behind the positions. States are fp32 ``[B, H, Dk, Dv]`` on both sides.

Documents apart (``starts``): fla's variable-length sequences (``cu_seqlens``), laid out as
:mod:`mcsd.ops.varlen` lays them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mcsd.ops.common import state_dtype
from mcsd.ops.gla.parallel import key_log_decay
from mcsd.ops.kernels import fla_kernel, outside_compiled_graphs
from mcsd.ops.varlen import document_pieces

DECAY_KEYWORD = {"chunk": "g", "recurrent": "gk"}  # what each fla GLA kernel calls the decay


@outside_compiled_graphs
def fla_gla(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, form: str = "chunk", kernel: Callable | None = None,
    starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mcsd.ops.gla.gla`'s contract through fla's ``form`` kernel (or ``kernel``, a
    function with fla's GLA keywords: its naive reference in the CPU tests), ``starts``
    ``[B, N]`` bool where the documents of a packed batch start."""
    kernel = kernel if kernel is not None else fla_kernel("gla", form)
    batch, heads, length, _ = q.shape
    accumulate = state_dtype(v)
    decay = key_log_decay(log_decay).transpose(1, 2)  # [B, N, H, Dk]
    q, k, v = (tensor.transpose(1, 2) for tensor in (q.to(v.dtype), k.to(v.dtype), v))  # [B, N, H, D]
    initial_state = None if initial_state is None else initial_state.to(accumulate)
    keyword = DECAY_KEYWORD[form]
    if starts is None:
        output, final = kernel(q=q, k=k, v=v, **{keyword: decay}, scale=1.0, initial_state=initial_state,
                               output_final_state=True)
        return output.transpose(1, 2).to(v.dtype), final.to(accumulate)
    pieces = document_pieces(starts, initial_state, heads, q.shape[-1], v.shape[-1], accumulate)
    flat = [tensor.reshape(1, batch * length, heads, -1) for tensor in (q, k, v, decay)]
    output, finals = kernel(q=flat[0], k=flat[1], v=flat[2], **{keyword: flat[3]}, scale=1.0,
                            initial_state=pieces.initial, output_final_state=True, cu_seqlens=pieces.cu_seqlens)
    return output.reshape(batch, length, heads, -1).transpose(1, 2).to(v.dtype), finals[pieces.row_last].to(accumulate)


def fla_gla_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, state: torch.Tensor,
    kernel: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token (:func:`mcsd.ops.gla.gla_step`'s contract) through fla's fused recurrent kernel."""
    output, state = fla_gla(q[:, :, None], k[:, :, None], v[:, :, None], log_decay[:, :, None], state,
                            form="recurrent", kernel=kernel)
    return output[:, :, 0], state
