"""Parallel (reference) form of the strictly causal exponential filter.

For one channel with decay ``a = exp(log_decay)`` the filter is

    y[n] = sum_{j<n} a^(n-j) x[j] + a^n h0,      final state h[N] = y[N],

i.e. ``y = M x`` with the lower-triangular Toeplitz matrix ``M[n, j] = a^(n-j)`` for
``j < n`` (zero on and above the diagonal). This form materialises ``M`` (O(N^2)) and is
the reference that the chunkwise and recurrent forms are tested against.

Documents apart (``starts`` ``[B, N]``, True where a document of a packed row starts): the
state is dropped before each start, so ``M[n, j]`` keeps only ``j`` of ``n``'s document and the
initial state reaches only the tokens before the first start.
"""

from __future__ import annotations

import torch

from mcsd.ops.common import document_index, state_dtype


def exp_filter_matrix(log_decay: torch.Tensor, length: int, extra_rows: int = 0) -> torch.Tensor:
    """``M[c, n, j] = a_c^(n-j)`` for ``j < n``, else 0; shape ``[C, length + extra_rows, length]``.

    The matrix is Toeplitz: its entries are read from the ``length + extra_rows`` powers
    ``a^k`` (fp32, from the log, :func:`decay_powers`: no overflow whatever the length) into
    one tensor that is then masked in place, with no exponential per entry and no other
    tensor of its size (the parallel forms build one per layer, and each costs its pages).
    """
    rows = torch.arange(length + extra_rows, device=log_decay.device)
    cols = torch.arange(length, device=log_decay.device)
    distance = rows[:, None] - cols[None, :]
    powers = decay_powers(log_decay, length + extra_rows)  # [C, length + extra_rows]
    return powers[:, distance.clamp(min=0)].masked_fill_(distance <= 0, 0.0)


def masked_powers(log_decay: torch.Tensor, distance: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``a_c^distance`` where ``keep``, else exactly 0; shape ``[C, *distance.shape]``, fp32:
    exponents masked to -inf before ``exp`` (in place, one tensor of that shape)."""
    exponent = log_decay.float().view(-1, *([1] * distance.dim())) * distance.float()
    return exponent.masked_fill_(~keep, float("-inf")).exp_()


def decay_powers(log_decay: torch.Tensor, length: int) -> torch.Tensor:
    """``a_c^n`` for ``n = 0 .. length-1``, shape ``[C, length]``, fp32."""
    positions = torch.arange(length, device=log_decay.device, dtype=torch.float32)
    return torch.exp(log_decay.float()[:, None] * positions)


def parallel_exp_filter(
    x: torch.Tensor, log_decay: torch.Tensor, initial_state: torch.Tensor | None = None,
    starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Filter ``x`` ``[B, C, N, D]`` with per-channel ``log_decay`` ``[C]``.

    Returns the output ``[B, C, N, D]`` (dtype of ``x``) and the final state ``[B, C, D]``
    (:func:`state_dtype`; the last document's). ``initial_state`` ``[B, C, D]`` is the state
    before position 0; ``starts`` ``[B, N]`` bool marks where documents start (None: one document).
    """
    length = x.shape[2]
    accumulate = state_dtype(x)
    matrix = exp_filter_matrix(log_decay, length, extra_rows=1)  # row N gives the final state
    if starts is not None:
        index = document_index(starts, length + 1)  # [B, N + 1]
        matrix = matrix[None] * (index[:, :, None] == index[:, None, :length])[:, None]  # [B, C, N + 1, N]
    y = torch.matmul(matrix.to(x.dtype), x).to(accumulate)
    if initial_state is not None:
        carry = decay_powers(log_decay, length + 1).to(accumulate)[None, :, :, None]
        if starts is not None:
            carry = carry * (index == 0)[:, None, :, None]
        y = y + carry * initial_state.to(accumulate)[:, :, None, :]
    return y[:, :, :-1].to(x.dtype), y[:, :, -1].clone()  # a state of its own, not a view of y
