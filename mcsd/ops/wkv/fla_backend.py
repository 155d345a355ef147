"""RWKV-4's WKV through flash-linear-attention's ``fused_recurrent_rwkv4`` (its only WKV
kernel: it serves the chunk form too, one pass over the positions per batch row and block of
channels). fla's state ``[B, 3, 1, D]`` holds the same ``(a, b, p)`` as ours (``p = -1e38``
empty), and its kernel decays by ``exp(-exp(w))``: it is given ``log(w)`` of our rate ``w``.
Its states, saved for the backward and returned, take the dtype of ``k``: the adapter hands it
fp32 keys and values, so that the state stays fp32 (ours is) at a 16-bit model's cost of one
fp32 copy of them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mcsd.ops.common import state_dtype
from mcsd.ops.kernels import fla_kernel, outside_compiled_graphs
from mcsd.ops.wkv.parallel import empty_wkv_state


@outside_compiled_graphs
def fla_wkv(
    w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    initial_state: torch.Tensor | None = None, form: str = "chunk", kernel: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mcsd.ops.wkv.wkv`'s contract through fla's kernel (or ``kernel``, a function with
    its signature)."""
    kernel = kernel if kernel is not None else fla_kernel("wkv", form)
    dtype = state_dtype(v)
    batch, _, channels = k.shape
    state = empty_wkv_state(batch, channels, k.device, dtype) if initial_state is None else initial_state.to(dtype)
    output, final = kernel(torch.log(w.to(dtype)), u.to(dtype), k.to(dtype), v.to(dtype), state[:, :, None])
    return output.to(v.dtype), final[:, :, 0]


def fla_wkv_step(
    w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor,
    kernel: Callable | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token (:func:`mcsd.ops.wkv.wkv_step`'s contract) through fla's kernel: one launch."""
    output, state = fla_wkv(w, u, k[:, None], v[:, None], state, form="recurrent", kernel=kernel)
    return output[:, 0], state
