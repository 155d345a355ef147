"""Renamed :mod:`mcsd.models.cuda_graphs` (the step at fixed addresses, replayed as CUDA graphs).
This name still imports, with a deprecation warning, until mcsd 0.2.0 (docs/layout.md, "Old names")."""

import warnings

from mcsd.models.cuda_graphs import DEFAULT_MIN_CAPACITY, WARMUP_STEPS, StaticStep, capacity_bucket

warnings.warn("mcsd.models.static_decoding is renamed mcsd.models.cuda_graphs: import that instead "
              "(the old name goes in mcsd 0.2.0)", DeprecationWarning, stacklevel=2)

__all__ = ["DEFAULT_MIN_CAPACITY", "WARMUP_STEPS", "StaticStep", "capacity_bucket"]
