"""bf16 autocast at long sequence lengths keeps MCSD's slow decays exact (every architecture's model
under bf16 at N = 4096: tests/models/test_conformance.py)."""

from __future__ import annotations

import torch

from helpers.models import relative_rms_error
from mcsd.models.mcsd import section_log_decay
from mcsd.ops.exp_filter import chunk_exp_filter

LENGTH = 4096


def test_filter_under_autocast_keeps_slow_decays_exact() -> None:
    """With C = 10 the slowest decay is alpha = 1 - 2^-14; rounded to bf16 it would be 1.0
    and old tokens would keep weight 1 instead of alpha^4096 = 0.78."""
    log_decay = section_log_decay("decay", 10, torch.device("cpu"))
    x = torch.randn(1, 10, LENGTH, 16)
    reference, reference_final = chunk_exp_filter(x, log_decay)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, final = chunk_exp_filter(x.bfloat16(), log_decay)
    assert final.dtype == torch.float32
    assert torch.isfinite(y).all() and torch.isfinite(final).all()
    assert relative_rms_error(final, reference_final) < 1e-2
    assert relative_rms_error(y.float(), reference) < 1e-2
