"""Which implementation runs an op's chunk and recurrent forms: this project's PyTorch forms
(the reference, on every device) or flash-linear-attention's fused Triton kernels (``fla``, on
a CUDA GPU). The setting is ``model.kernels``:

- ``torch``: the PyTorch forms everywhere;
- ``fla``: fla's kernels for the forms it has (an error, in one line, where it cannot run);
- ``auto``: fla on a CUDA GPU when it imports, PyTorch otherwise.

The parallel forms are always PyTorch's: they are the reference. Each op's adapter (the
shapes, the shift and the state conventions that map it onto fla's op) lives beside the op,
in ``fla_backend.py``; this module only decides and loads.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable

import torch

from mcsd.errors import MCSDError

KERNELS = ("auto", "torch", "fla")
"""The values of ``model.kernels``."""

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'mcsd[gpu]' (fla-core and einops; Triton comes with CUDA PyTorch)"

FLA_KERNELS: dict[tuple[str, str], tuple[str, str]] = {
    ("exp_filter", "chunk"): ("fla.ops.hgrn", "chunk_hgrn"),
    ("exp_filter", "recurrent"): ("fla.ops.hgrn", "fused_recurrent_hgrn"),
    ("decayed_attention", "chunk"): ("fla.ops.simple_gla", "chunk_simple_gla"),
    ("decayed_attention", "recurrent"): ("fla.ops.simple_gla", "fused_recurrent_simple_gla"),
    ("delta_rule", "chunk"): ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    ("delta_rule", "recurrent"): ("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule"),
    ("gla", "chunk"): ("fla.ops.gla", "chunk_gla"),
    ("gla", "recurrent"): ("fla.ops.gla", "fused_recurrent_gla"),
    ("wkv", "chunk"): ("fla.ops.rwkv4", "fused_recurrent_rwkv4"),  # fla has only the fused recurrence
    ("wkv", "recurrent"): ("fla.ops.rwkv4", "fused_recurrent_rwkv4"),
}
"""``(op, form)`` -> ``(module, function)`` of the fla kernel that serves it."""


class KernelsUnavailable(MCSDError):
    """``model.kernels=fla`` where fla's kernels cannot run."""


@functools.cache
def fla_import_problem() -> str | None:
    """Why fla's ops do not import here (``None`` when they do); tried once per process."""
    try:
        for module in {module for module, _ in FLA_KERNELS.values()}:
            importlib.import_module(module)
    except Exception as error:  # noqa: BLE001 - a missing package, or a Triton that does not fit this torch
        return f"{type(error).__name__}: {error}".splitlines()[0]
    return None


def fla_runs_on(device: torch.device) -> bool:
    """Whether fla's Triton kernels run on ``device``: a CUDA GPU."""
    return device.type == "cuda"


def kernels_problem(kernels: str, device: torch.device | str) -> str | None:
    """Why ``kernels`` cannot run on ``device`` (one line naming the setting and the fix), or
    ``None``: what the commands check before anything runs."""
    if kernels != "fla":
        return None
    device = torch.device(device)
    if not fla_runs_on(device):  # said before fla is imported (seconds)
        return (f"model.kernels=fla runs Triton kernels on a CUDA GPU, and this model runs on {device.type}: "
                "use model.kernels=auto (fla on a GPU, PyTorch elsewhere) or model.kernels=torch")
    problem = fla_import_problem()
    if problem is not None:
        return (f"model.kernels=fla needs flash-linear-attention's kernels, which do not import here ({problem}): "
                f"{INSTALL_HINT}, or use model.kernels=auto (PyTorch where fla cannot run) or model.kernels=torch")
    return None


@torch.compiler.assume_constant_result
def fla_imports() -> bool:
    """Whether fla's ops import here: a constant of a compiled graph (asked while tracing, never
    traced: the import is not a graph's work)."""
    return fla_import_problem() is None


def uses_fla(kernels: str, device: torch.device, form: str) -> bool:
    """Whether an op's ``form`` on ``device`` runs through fla's kernels under ``kernels``."""
    if kernels == "torch" or form == "parallel":
        return False
    if fla_runs_on(device) and fla_imports():
        return True
    if kernels == "auto":
        return False
    raise KernelsUnavailable(kernels_problem(kernels, device))


@functools.cache
def fla_kernel(op: str, form: str) -> Callable:
    """The fla function that serves ``op``'s ``form`` (:data:`FLA_KERNELS`). The adapters that
    call it run outside ``torch.compile``'s graphs (:func:`outside_compiled_graphs`)."""
    module, name = FLA_KERNELS[(op, form)]
    return getattr(importlib.import_module(module), name)


def outside_compiled_graphs(adapter: Callable) -> Callable:
    """An adapter that a compiled model calls eagerly, one graph break around it: fla's Triton
    kernels are compiled already, and finding them (an import) is no graph's work."""
    return torch.compiler.disable(adapter)


def odd_width_problem(q: torch.Tensor, v: torch.Tensor, form: str) -> str | None:
    """What fla's chunk kernels refuse in a backward, for every op they serve: 16-bit keys or
    values of odd width (with the fix), or ``None``."""
    if form != "chunk" or not torch.is_grad_enabled():
        return None
    key_width, value_width = q.shape[-1], v.shape[-1]
    if q.dtype in (torch.float16, torch.bfloat16) and (key_width % 2 or value_width % 2):
        return (f"fla's chunk backward needs even key and value widths in 16-bit, and these are {key_width} and "
                f"{value_width}: choose even head widths")
    return None


def fall_back(kernels: str, problem: str) -> None:
    """fla cannot serve one call, for ``problem`` (what it refuses, and the fix): under
    ``kernels=fla`` an error, in one line; under ``auto`` that call runs the PyTorch form (said
    once per problem)."""
    if kernels == "fla":
        raise KernelsUnavailable(f"model.kernels=fla: {problem}; or use model.kernels=auto (the PyTorch form "
                                 "where fla cannot serve)")
    _say_once(problem)


@functools.cache
def _say_once(problem: str) -> None:
    log.warning("model.kernels=auto: %s; the PyTorch form runs there", problem)
