"""bf16 autocast at long sequence lengths: finite, close to fp32, decays kept in fp32."""

from __future__ import annotations

import pytest
import torch

from conftest import relative_rms_error
from mcsd import build_model
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


@pytest.mark.parametrize("target", ["mcsd.models.config.MCSDConfig", "mcsd.models.config.TransformerConfig"])
@torch.no_grad()
def test_model_under_bf16_autocast_at_4096_tokens(target: str) -> None:
    config = dict(_target_=target, vocab_size=257, hidden_size=40, num_channels=10, num_layers=2,
                  mlp_hidden_size=64, chunk_size=64)
    model = build_model(config).eval()
    input_ids = torch.randint(0, 257, (1, LENGTH))
    reference = model(input_ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, state = model.prefill(input_ids)
        full = model(input_ids)
    assert torch.isfinite(full).all()
    assert relative_rms_error(full.float(), reference) < 5e-2
    assert relative_rms_error(logits.float(), reference[:, -1]) < 5e-2
    if "MCSD" in target:
        assert all(s.dtype == torch.float32 for layer in state.layers for s in layer)
