"""What fla's references lack for the CPU tests: its RWKV-4 kernel (``fla.ops.rwkv4.fused_recurrent_rwkv4``,
which has no naive reference of its own) written out in PyTorch from its Triton source, in its
conventions (the decay is ``exp(-exp(w))``, the state ``[B, 3, 1, D]`` holds ``(alpha, beta, eps)``;
the interpreter test checks it against the kernel itself), and its simple GLA references given
the per-head decay ``g_gamma`` and the variable-length sequences (``cu_seqlens``) that its
kernels take, its GLA reference given the keywords and the scale its kernels take, and its
gated delta rule reference given variable-length sequences."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def naive_recurrent_rwkv4(
    w: torch.Tensor, u: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``w``, ``u`` ``[D]``, ``k``, ``v`` ``[B, T, D]``, ``state`` ``[B, 3, 1, D]`` -> (wkv ``[B, T, D]``,
    the state after the last token ``[B, 3, 1, D]``), in the dtype of ``k``."""
    decay = -torch.exp(w.float())
    alpha, beta, eps = (part[:, 0].float() for part in state.unbind(1))
    outputs = []
    for t in range(k.shape[1]):
        key, value = k[:, t].float(), v[:, t].float()
        bonus = u.float() + key
        tau = torch.maximum(bonus, eps)
        old, new = torch.exp(eps - tau), torch.exp(bonus - tau)
        outputs.append((old * alpha + new * value) / (old * beta + new))
        decayed = decay + eps
        eps = torch.maximum(decayed, key)
        old, new = torch.exp(decayed - eps), torch.exp(key - eps)
        alpha, beta = old * alpha + new * value, old * beta + new
    final = torch.stack([alpha, beta, eps], dim=1)[:, :, None]
    return torch.stack(outputs, dim=1).to(k.dtype), final.to(k.dtype)


def with_head_decay(reference: Callable) -> Callable:
    """fla's simple GLA reference given ``g_gamma`` (a log-decay per head ``[H]``, which its kernels
    take and its references do not) as the per-token ``g`` it stands for, and ``cu_seqlens`` (one
    row ``[1, T, ...]`` holding sequences end to end, each from its own initial state, as fla's
    kernels take them and its references do not) as one call per sequence."""
    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None = None,
               g_gamma: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None,
               initial_state: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if g_gamma is not None:
            g = g_gamma.expand(q.shape[0], q.shape[1], -1)
        return by_sequence(lambda q, k, v, g, initial: reference(q, k, v, g=g, initial_state=initial, **kwargs),
                           (q, k, v, g), initial_state, cu_seqlens)
    return kernel


def with_gla_keywords(reference: Callable) -> Callable:
    """fla's GLA reference (``naive_recurrent_gla``: the decay as ``gk``, its own scale
    ``K ** -0.5``, no ``cu_seqlens``) called as its kernels are: the decay as ``g``
    (``chunk_gla``) or ``gk`` (``fused_recurrent_gla``), a ``scale`` of the caller's, and
    variable-length sequences (one call per sequence)."""
    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor | None = None,
               gk: torch.Tensor | None = None, scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
               initial_state: torch.Tensor | None = None, output_final_state: bool = False,
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if scale is not None:
            q = q * (scale * q.shape[-1] ** 0.5)  # the reference multiplies by K ** -0.5 itself
        return by_sequence(lambda q, k, v, decay, initial: reference(
            q, k, v, decay, initial_state=initial, output_final_state=output_final_state),
            (q, k, v, g if g is not None else gk), initial_state, cu_seqlens)
    return kernel


def with_sequences(reference: Callable) -> Callable:
    """An fla reference that takes its kernel's keywords but not ``cu_seqlens`` (the gated delta
    rule's) given variable-length sequences: one call per sequence."""
    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
               cu_seqlens: torch.Tensor | None = None, initial_state: torch.Tensor | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return by_sequence(lambda q, k, v, g, beta, initial: reference(
            q=q, k=k, v=v, g=g, beta=beta, initial_state=initial, **kwargs), (q, k, v, g, beta), initial_state, cu_seqlens)
    return kernel


def by_sequence(call: Callable, tensors: tuple[torch.Tensor, ...], initial_state: torch.Tensor | None,
                cu_seqlens: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``call(*tensors, initial_state)``, or with ``cu_seqlens`` (one row ``[1, T, ...]`` of
    sequences end to end, as fla's kernels take them) once per sequence from its own initial
    state: the outputs end to end and the final states stacked."""
    if cu_seqlens is None:
        return call(*tensors, initial_state)
    assert tensors[0].shape[0] == 1 and cu_seqlens[0] == 0 and cu_seqlens[-1] == tensors[0].shape[1]  # fla's own
    pieces = [call(*(tensor[:, start:end] for tensor in tensors),
                   None if initial_state is None else initial_state[index:index + 1])
              for index, (start, end) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()))]
    return torch.cat([output for output, _ in pieces], dim=1), torch.cat([final for _, final in pieces])
