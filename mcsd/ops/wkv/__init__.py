"""RWKV-4's WKV: a per-channel softmax-like average of past values under a learned decay
``w`` with a bonus ``u`` for the current token, in three forms that compute the same
function: ``parallel`` (all logits of a row at once, the reference), ``chunk`` (parallel
inside chunks, the state carried across them: the training form) and ``recurrent`` (one
token at a time with the max trick: decoding). The state ``(a, b, p)`` ``[B, 3, D]`` is fp32;
no form exponentiates a key unguarded. ``kernels`` (:mod:`mcsd.ops.kernels`) runs the chunk and
recurrent forms and the decoding step through flash-linear-attention's fused RWKV-4 kernel
(:mod:`mcsd.ops.wkv.fla_backend`) on a GPU.
"""

from __future__ import annotations

import functools

import torch

from mcsd.ops.common import FORMS
from mcsd.ops.context import CHUNK, ForwardContext
from mcsd.ops.dispatch import dispatch
from mcsd.ops.wkv.chunk import chunk_wkv
from mcsd.ops.wkv.fla_backend import fla_wkv
from mcsd.ops.wkv.parallel import EMPTY_LOG_SCALE, empty_wkv_state, parallel_wkv
from mcsd.ops.wkv.recurrent import recurrent_wkv, wkv_step


def wkv(
    w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    initial_state: torch.Tensor | None = None, context: ForwardContext = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch to ``context``'s form (and to fla's kernel for it where ``context.kernels`` says
    so); returns ``(wkv [B, N, D], final_state [B, 3, D] fp32)``, the documents of a packed batch
    apart where ``context.starts`` says they start (the PyTorch forms only: fla's RWKV-4 kernel
    takes neither variable-length sequences nor a per-token decay, so fla cannot reset its state
    at a start)."""
    inputs, starts = (w, u, k, v, initial_state), context.starts
    return dispatch(context, k.device, {
        "parallel": functools.partial(parallel_wkv, *inputs, starts),
        "chunk": functools.partial(chunk_wkv, *inputs, context.chunk_size, starts),
        "recurrent": functools.partial(recurrent_wkv, *inputs, starts),
    }, fla=functools.partial(fla_wkv, *inputs, context.form),
        fla_problem=lambda: None if starts is None else (
            "fla's RWKV-4 kernel cannot keep documents apart (it takes neither variable-length sequences nor a "
            "per-token decay): use data.documents=joined"))


__all__ = [
    "EMPTY_LOG_SCALE",
    "FORMS",
    "chunk_wkv",
    "empty_wkv_state",
    "fla_wkv",
    "parallel_wkv",
    "recurrent_wkv",
    "wkv",
    "wkv_step",
]
