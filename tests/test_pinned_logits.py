"""MCSD's numbers are pinned: logits of a seeded tiny model, computed before the architecture
registry refactor (commit f75ddb4), must not change (same initialisation, same math). The
decay settings that existed implicitly then are set explicitly (``LEGACY_DECAY``), so that the
old behaviour stays one override away whatever the defaults become."""

from __future__ import annotations

import pytest
import torch

from mcsd import build_model

# Computed at f75ddb4 with the code below: logits[:, ::9, :3] flattened, the sum, the mean square.
PINNED = {
    "full": (
        {},
        [-0.712566, -1.431262, -1.3464142, 1.2935102, -1.4699425, 1.9909493, -1.7974906, 1.4400362, -0.9246352,
         0.2540749, -2.4088953, -0.2454754, 1.6829064, -2.7309177, 2.3406971, 0.1795937, -0.3678573, 2.7144659,
         0.4693843, -2.0074434, 0.3123727, 0.2824894, -1.264308, 1.8822809, 1.2308366, -1.5799661, 2.3503895,
         1.2940964, -1.0977708, 0.4697059],
        355.892507, 2.12841376,
    ),
    "decay_slope_slope_sum": (
        {"sections": ["decay", "slope", "slope"], "fusion": "sum"},
        [-0.0806573, -2.7030356, 0.4137798, -1.2047137, -1.6504222, -0.7371633, -1.2927479, -1.9409152, 0.2792973,
         -1.9296609, -1.5702463, -0.9698778, -0.0731193, 0.5223489, 1.3982818, 1.1375059, 1.0370479, -1.6656615,
         0.0317376, -2.7476356, -0.9882454, -1.1264337, -3.7690752, -1.5449948, 1.3696676, 0.9515665, -1.601408,
         -1.5241221, -3.5823131, -1.3445067],
        551.904112, 2.24131655,
    ),
}


LEGACY_DECAY = {"decay_norm": "rmsnorm", "decay_norm_gain_init": 1.0}


@pytest.mark.parametrize("name", PINNED)
@torch.no_grad()
def test_seeded_tiny_mcsd_logits_are_pinned(name: str) -> None:
    extra, values, total, mean_square = PINNED[name]
    torch.manual_seed(0)
    model = build_model(dict(_target_="mcsd.models.config.MCSDConfig", vocab_size=101, hidden_size=24, num_channels=3,
                             num_layers=2, mlp_hidden_size=40, chunk_size=16, init_std=0.3, **LEGACY_DECAY,
                             **extra)).eval()
    ids = (torch.arange(2 * 37).reshape(2, 37) * 7) % 101
    logits = model(ids)
    torch.testing.assert_close(logits[:, ::9, :3].flatten(), torch.tensor(values), rtol=0, atol=2e-6)
    assert logits.double().sum().item() == pytest.approx(total, abs=1e-4)
    assert logits.double().pow(2).mean().item() == pytest.approx(mean_square, abs=1e-7)
