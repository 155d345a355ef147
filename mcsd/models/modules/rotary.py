"""Rotary position embedding (RoPE, half-split), shared by every architecture that rotates its
queries and keys (the Transformer, RetNet, the hybrid's SSD and attention)."""

from __future__ import annotations

import torch

from mcsd.ops.common import cached_tensors


def rotary(x: torch.Tensor, position: int | torch.Tensor, base: float) -> torch.Tensor:
    """Rotate ``x`` ``[B, H, N, Dh]`` at absolute positions ``position..`` (RoPE, half-split), or
    at each token's own position (``position`` ``[B, N]``: documents apart, each from 0),
    computed in fp32 (fp64 for an fp64 ``x``)."""
    length, width = x.shape[2], x.shape[3]
    dtype = torch.promote_types(x.dtype, torch.float32)
    if isinstance(position, torch.Tensor):
        positions = position.to(dtype)[:, None, :, None]  # [B, 1, N, 1]: every head alike
    else:
        positions = torch.arange(position, position + length, device=x.device, dtype=dtype)[:, None]
    angles = positions * inverse_frequency(width, base, x.device, dtype)
    return _rotate(x, angles.cos(), angles.sin())


def rotary_step(x: torch.Tensor, position: int | torch.Tensor, base: float) -> torch.Tensor:
    """:func:`rotary` of one position, ``x`` ``[..., Dh]``: the same numbers, no positions tensor
    (``position`` an int, or a 0-d tensor on the device in the step at fixed addresses); or of
    each row's own, ``position`` ``[B]`` (a padded batch) for ``x`` ``[B, ..., Dh]``."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    frequency = inverse_frequency(x.shape[-1], base, x.device, dtype)
    if isinstance(position, torch.Tensor) and position.dim() == 1:
        angles = (position.to(dtype)[:, None] * frequency).view(-1, *([1] * (x.dim() - 2)), frequency.shape[0])
    else:
        angles = frequency * position
    return _rotate(x, angles.cos(), angles.sin())


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.to(cos.dtype).chunk(2, dim=-1)
    rotated = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    return rotated.to(x.dtype)


def inverse_frequency(width: int, base: float, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """RoPE's ``base^(-2i/Dh)``, ``[Dh / 2]`` (fp32 unless ``dtype`` says fp64): cached for eager
    calls, a constant of a compiled graph."""
    if torch.compiler.is_compiling():
        return _inverse_frequency_values(width, base, device, dtype)
    return _cached_inverse_frequency(width, base, device, dtype)


def _inverse_frequency_values(width: int, base: float, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return base ** (-torch.arange(0, width, 2, device=device, dtype=dtype) / width)


_cached_inverse_frequency = cached_tensors()(_inverse_frequency_values)
