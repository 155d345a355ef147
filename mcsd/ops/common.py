"""What every op shares: the names of the three forms, the dtype of states and carries, and the
sums of log-decays between positions that the decayed ops' forms take."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch

FORMS = ("parallel", "chunk", "recurrent")
"""The forms every op (and every exact architecture) computes the same function in."""


def check_form(form: str) -> None:
    """Refuse a form that is not one of :data:`FORMS`, in one line."""
    if form not in FORMS:
        raise ValueError(f"form={form!r} is unknown: use one of {', '.join(FORMS)}")


def state_dtype(x: torch.Tensor) -> torch.dtype:
    """States and carries are kept in fp32 (fp64 when the input is fp64, for gradcheck)."""
    return torch.promote_types(x.dtype, torch.float32)


def in_state_dtype(device: torch.device) -> contextlib.AbstractContextManager:
    """A region whose products run in the dtype of their inputs, which the forms make fp32
    (:func:`state_dtype`) for states and carries: autocast, where it is on, would run them in
    bf16/fp16. (The dtype is named: asking autocast for its own fails in some processes.)"""
    if device.type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.get_autocast_dtype(device.type), enabled=False)


def cached_tensors(maxsize: int | None = None) -> Callable[[Callable[..., torch.Tensor]], Callable[..., torch.Tensor]]:
    """``functools.lru_cache`` for a function that builds a constant tensor (a table, fixed decays),
    the tensor built outside inference mode: one first built under ``torch.inference_mode``
    (``generate``) would be an inference tensor, which autograd refuses to save when a later
    step builds a graph (training after sampling, a step with gradients)."""
    def decorate(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        @functools.lru_cache(maxsize=maxsize)
        @functools.wraps(function)
        def cached(*arguments: Any) -> torch.Tensor:
            with torch.inference_mode(False):
                return function(*arguments)
        return cached
    return decorate


def constant_tensor(values: tuple[float, ...], device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Fixed ``values`` (a decay per channel or head) as a tensor on ``device``, built from fp64 and
    cast once: cached for eager calls (a step replayed at fixed addresses never copies from the
    host), a constant of a compiled graph."""
    if torch.compiler.is_compiling():
        return _constant_tensor(values, device, dtype)
    return _cached_constant_tensor(values, device, dtype)


def _constant_tensor(values: tuple[float, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(device=device, dtype=dtype)


_cached_constant_tensor = cached_tensors()(_constant_tensor)


def document_index(starts: torch.Tensor, length: int | None = None) -> torch.Tensor:
    """The document of each position of a packed batch, ``[B, length]`` int64, from ``starts``
    ``[B, N]`` (True where a document starts: no state reaches that token from before it): how
    many documents started at or before the position, so 0 is the document an initial state
    belongs to. Positions past ``N`` (a form's padding) keep the last position's document."""
    index = starts.long().cumsum(1)
    extra = (length or index.shape[1]) - index.shape[1]
    return torch.cat([index, index[:, -1:].expand(-1, extra)], 1) if extra > 0 else index


def segment_log_decays(log_decay: torch.Tensor) -> torch.Tensor:
    """``[..., N]`` -> ``[..., N, N]``: ``g_{m+1} + ... + g_n`` at ``[n, m]`` for ``m <= n`` (0 on the
    diagonal), ``-inf`` above it. A masked cumulative sum down each column, never the difference
    ``G_n - G_m`` of two cumulative sums: that difference loses the digits of a short segment
    once ``|G|`` is large (at ``|G| = 1000`` fp32 keeps about 1e-4 of it), this sum does not."""
    length = log_decay.shape[-1]
    rows = torch.arange(length, device=log_decay.device)
    after_column = rows[:, None] > rows[None, :]  # [r, m]: r > m
    terms = log_decay[..., :, None].expand(*log_decay.shape, length)  # [..., r, m] = g_r
    sums = terms.masked_fill(~after_column, 0.0).cumsum(dim=-2)  # [..., n, m] = sum_{m < r <= n} g_r
    return sums.masked_fill(rows[:, None] < rows[None, :], float("-inf"))
