"""The fixed per-channel decays: ALiBi's slopes (MCSD's slope section, Eq. 2) and RetNet's
decays (MCSD's decay section, Eq. 8, and RetNet's retention), as log-decays for the ops."""

from __future__ import annotations

import math

import torch

from mcsd.ops.common import constant_tensor


def slope_rates(num_channels: int) -> list[float]:
    """Eq. 2: ``beta_i = (2^(-8/C))^(i+1)``, ALiBi's slopes."""
    return [(2.0 ** (-8.0 / num_channels)) ** (i + 1) for i in range(num_channels)]


def decay_rates(num_channels: int, offset: float = 5.0) -> list[float]:
    """Eq. 8: ``alpha_i = 1 - 2^(-5-i)``, RetNet's decays (``1 - 2^(-offset-i)`` for another
    ``offset``: RetNet's ``decay_offset``, shorter memories below 5, longer above)."""
    return [1.0 - 2.0 ** (-offset - i) for i in range(num_channels)]


def log_decay_values(kind: str, num_channels: int, offset: float = 5.0) -> list[float]:
    """Per-channel log-decay of a section, in float64: ``-beta_i`` (slope) or ``log(alpha_i)``
    (decay; in bf16 ``alpha_i`` itself would round to 1.0 for i >= 4, so only the log is kept)."""
    if kind == "slope":
        return [-beta for beta in slope_rates(num_channels)]
    return [math.log(alpha) for alpha in decay_rates(num_channels, offset)]


def section_log_decay(kind: str, num_channels: int, device: torch.device,
                      dtype: torch.dtype = torch.float32, offset: float = 5.0) -> torch.Tensor:
    """:func:`log_decay_values` as a tensor ``[C]``, fp32 (or ``dtype``: fp64 for a baseline run
    in fp64), never cast by ``model.to(dtype)``: cached for eager calls (built once per device
    and dtype), a constant of a compiled graph (:func:`mcsd.ops.common.constant_tensor`)."""
    return constant_tensor(tuple(log_decay_values(kind, num_channels, offset)), device, dtype)


def draw_dt_bias_(bias: torch.Tensor, dt_min: float, dt_max: float) -> None:
    """Mamba-2's draw of dt's bias, in place: ``softplus(bias)`` log-uniform in [``dt_min``, ``dt_max``]
    (one draw per head from torch's generator)."""
    low, high = math.log(dt_min), math.log(dt_max)
    dt = torch.exp(torch.rand(bias.shape[0]) * (high - low) + low)
    with torch.no_grad():
        bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
