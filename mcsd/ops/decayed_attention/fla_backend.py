"""Decayed linear attention through flash-linear-attention's simple GLA kernels
(``chunk_simple_gla``, ``fused_recurrent_simple_gla``): ``S_t = exp(g_t) S_{t-1} + k_t^T v_t``,
``o_t = scale * q_t S_t`` with a per-token log-decay ``g`` ``[B, T, H]`` (SSD) or a constant one per
head ``g_gamma`` ``[H]`` (RetNet): ours exactly, with ``scale = 1`` (the callers scale their keys)
and the heads moved behind the positions (``[B, T, H, D]``: a view when the caller's
``[B, H, N, D]`` is one of ``[B, N, H, D]``). States are fp32 ``[B, H, Dk, Dv]`` on both sides.

Documents apart (``starts``): fla's variable-length sequences (``cu_seqlens``), the field's
convention for a packed batch: the rows are laid end to end as one sequence of ``B * N`` tokens,
cut at every document start and every row start; each piece starts from a zero state (a row's
first piece from its initial state, where the row does not begin with a document start), and a
row's final state is that of its last piece. A log-decay of ``-inf`` would not do here: fla's
chunk kernel takes differences of cumulative decays (``inf - inf``).

fla refuses two backwards of its chunk kernel (:func:`fla_problem`): 16-bit keys or values of
odd width, and a per-token decay's on Hopper GPUs with Triton 3.4 to 3.7.0 (wrong results
there, fla issue 640: the GPU image's Triton 3.6 is one), where ``auto`` trains with the
PyTorch form instead.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from mcsd.ops.common import state_dtype
from mcsd.ops.decayed_attention.parallel import per_token_log_decay
from mcsd.ops.kernels import fla_kernel, odd_width_problem, outside_compiled_graphs
from mcsd.ops.varlen import document_pieces


@outside_compiled_graphs
def fla_decayed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
    initial_state: torch.Tensor | None = None, form: str = "chunk", kernel: Callable | None = None,
    starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mcsd.ops.decayed_attention.decayed_attention`'s contract through fla's ``form``
    kernel (or ``kernel``, a function with fla's simple GLA keywords: its naive references in
    the CPU tests), ``starts`` ``[B, N]`` bool where the documents of a packed batch start."""
    kernel = kernel if kernel is not None else fla_kernel("decayed_attention", form)
    batch, heads, length, _ = q.shape
    accumulate = state_dtype(v)
    decay = ({"g_gamma": log_decay.to(accumulate)} if log_decay.dim() == 1
             else {"g": per_token_log_decay(log_decay, batch, length).transpose(1, 2)})  # [B, N, H]
    # fla's kernels take q, k and v in one dtype: the values' (what autocast's products would use)
    q, k, v = (tensor.transpose(1, 2) for tensor in (q.to(v.dtype), k.to(v.dtype), v))  # [B, N, H, D]
    initial_state = None if initial_state is None else initial_state.to(accumulate)
    if starts is None:
        output, final = kernel(q=q, k=k, v=v, **decay, scale=1.0, initial_state=initial_state,
                               output_final_state=True)
        return output.transpose(1, 2).to(v.dtype), final.to(accumulate)
    pieces = document_pieces(starts, initial_state, heads, q.shape[-1], v.shape[-1], accumulate)
    if "g" in decay:
        decay["g"] = decay["g"].reshape(1, batch * length, heads)
    output, finals = kernel(q=q.reshape(1, batch * length, heads, -1), k=k.reshape(1, batch * length, heads, -1),
                            v=v.reshape(1, batch * length, heads, -1), **decay, scale=1.0, initial_state=pieces.initial,
                            output_final_state=True, cu_seqlens=pieces.cu_seqlens)
    return output.reshape(batch, length, heads, -1).transpose(1, 2).to(v.dtype), finals[pieces.row_last].to(accumulate)


def fla_decayed_attention_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, state: torch.Tensor,
    kernel: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token (:func:`mcsd.ops.decayed_attention.decayed_attention_step`'s contract) through
    fla's fused recurrent kernel: one launch for the state's update and read."""
    output, state = fla_decayed_attention(q[:, :, None], k[:, :, None], v[:, :, None], log_decay[..., None], state,
                                          form="recurrent", kernel=kernel)
    return output[:, :, 0], state


@torch.compiler.assume_constant_result
def gated_chunk_backward_refused() -> bool:
    """Whether fla refuses the backward of its chunk kernel with a per-token decay here: on a
    Hopper GPU with Triton >= 3.4, < 3.7.1 (its own test, read from its flags)."""
    flags = importlib.import_module("fla.ops.common.chunk_o")
    return bool(getattr(flags, "IS_NVIDIA_HOPPER", False) and getattr(flags, "TRITON_ABOVE_3_4_0", False)
                and not getattr(flags, "TRITON_ABOVE_3_7_1", True))


def fla_problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, form: str) -> str | None:
    """Why fla's kernel cannot serve this call (what it would refuse in the backward, and the
    fix), or ``None``."""
    if form != "chunk" or not torch.is_grad_enabled() or not any(
            tensor.requires_grad for tensor in (q, k, v, log_decay)):
        return None
    problem = odd_width_problem(q, v, form)
    if problem is not None:
        return problem
    if log_decay.dim() > 1 and gated_chunk_backward_refused():
        import triton  # fla imported it

        return (f"fla refuses the backward of its chunk kernel with a per-token decay (SSD) on Hopper GPUs with "
                f"Triton {triton.__version__} (3.4 to 3.7.0 give wrong results, fla issue 640): upgrade Triton to 3.7.1 "
                "or later")
    return None
