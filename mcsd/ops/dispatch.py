"""The one dispatcher of the ops: a form, and where ``model.kernels`` says so fla's kernel for it.

Every op (``exp_filter``, ``decayed_attention``, ``wkv``) hands over its PyTorch forms (and its
decoding step, the recurrent form of one token) and its fla adapter as calls ready to make, with
the call's :class:`~mcsd.ops.context.ForwardContext`; this module picks one: fla's where
:func:`uses_fla` says it runs and the adapter has no objection to the call (``fla_problem``:
what fla would refuse; :func:`fall_back` then), else the PyTorch form.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

from mcsd.ops.common import check_form
from mcsd.ops.context import ForwardContext
from mcsd.ops.kernels import fall_back, uses_fla

Result = TypeVar("Result")


def dispatch(
    context: ForwardContext, device: torch.device, forms: Mapping[str, Callable[[], Result]],
    fla: Callable[[], Result], fla_problem: Callable[[], str | None] | None = None,
) -> Result:
    """``forms[context.form]()`` (the PyTorch form), or ``fla()`` where fla's kernels serve the
    form on ``device`` under ``context.kernels`` and ``fla_problem()`` finds nothing fla would
    refuse."""
    check_form(context.form)
    if uses_fla(context.kernels, device, context.form):
        problem = fla_problem() if fla_problem is not None else None
        if problem is None:
            return fla()
        fall_back(context.kernels, problem)
    return forms[context.form]()
