"""Token-mixing ops: one package per op (``mcsd/ops/<op>/``), each with its forms, and what they
share (the forward context, the dispatcher, the kernels setting, FLOPs)."""

import pkgutil

OPS = tuple(module.name for module in pkgutil.iter_modules(__path__) if module.ispkg)
"""The ops: every package under ``mcsd/ops/`` (an architecture names those it runs, ``Architecture.ops``)."""
