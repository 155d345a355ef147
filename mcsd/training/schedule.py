"""Learning-rate schedule: linear warmup, then cosine decay to a floor."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


AUTO_WARMUP_FRACTION = 0.1  # warmup_steps=auto: a tenth of the run ...
AUTO_WARMUP_CAP = 2000  # ... and at most this many steps


def auto_warmup_steps(total_steps: int) -> int:
    """``warmup_steps=auto``: a tenth of the run's steps, at least 1 and at most 2000 (the
    300-step main job warms up for 30, as it always has)."""
    return max(1, min(AUTO_WARMUP_CAP, int(AUTO_WARMUP_FRACTION * total_steps)))


def warmup_cosine(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int | str = "auto", min_lr_ratio: float = 0.1
) -> LambdaLR:
    """Multiply the base lr by ``step / warmup`` for ``warmup_steps`` steps (``auto``:
    :func:`auto_warmup_steps`), then follow a cosine from 1 down to ``min_lr_ratio`` at ``total_steps``."""
    if warmup_steps == "auto":
        warmup_steps = auto_warmup_steps(total_steps)
    warmup_steps = min(warmup_steps, max(total_steps - 1, 0))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)
