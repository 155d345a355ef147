"""What every op shares: the names of the three forms and the dtype of states and carries."""

from __future__ import annotations

import contextlib

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
