"""MCSD's numbers are pinned: logits of a tiny model, computed before the architecture registry
refactor (commit f75ddb4), must not change (same math). The decay settings that existed implicitly
then are set explicitly (``LEGACY_DECAY``), so that the old behaviour stays one override away
whatever the defaults become.

The weights are those that seed 0 drew before models were built on the meta device (saved at
5fee4d4 in ``tests/fixtures/pinned_tiny_mcsd/``): since then a model is initialised once, on its
device and in its dtype, and the same seed draws other values (issue 54). The new initialisation
is pinned apart (:func:`test_seeded_initialisation_is_pinned`)."""

from __future__ import annotations


import pytest
import torch
from safetensors.torch import load_file

from helpers import FIXTURES
from mcsd import build_model

WEIGHTS = FIXTURES / "pinned_tiny_mcsd"

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


def tiny_mcsd_config(**extra: object) -> dict[str, object]:
    return dict(_target_="mcsd.models.config.MCSDConfig", vocab_size=101, hidden_size=24, num_channels=3,
                num_layers=2, mlp_hidden_size=40, chunk_size=16, init_std=0.3, **{**LEGACY_DECAY, **extra})


def pinned_tiny_mcsd(name: str, **extra: object) -> torch.nn.Module:
    """The tiny MCSD of ``extra`` holding the pinned weights saved as ``name``."""
    model = build_model(tiny_mcsd_config(**extra)).eval()
    model.load_state_dict(load_file(WEIGHTS / f"{name}.safetensors"))
    return model


@pytest.mark.parametrize("name", PINNED)
@torch.no_grad()
def test_tiny_mcsd_logits_are_pinned(name: str) -> None:
    extra, values, total, mean_square = PINNED[name]
    model = pinned_tiny_mcsd(name, **extra)
    ids = (torch.arange(2 * 37).reshape(2, 37) * 7) % 101
    logits = model(ids)
    torch.testing.assert_close(logits[:, ::9, :3].flatten(), torch.tensor(values), rtol=0, atol=2e-6)
    assert logits.double().sum().item() == pytest.approx(total, abs=1e-4)
    assert logits.double().pow(2).mean().item() == pytest.approx(mean_square, abs=1e-7)


# Decoding: prefill 5 tokens, then 32 steps; logits[:, ::8, :3] of the steps flattened, the
# sum, the mean square. Computed at 1ab3077, before MCSD's lean decoding step (which
# reproduces them bit for bit on the machine that made them). Their tolerance is wider than the
# forward's: 32 steps accumulate fp32 round-off, which the CPU's kernel path changes (measured on
# an AVX-512 CPU: fp32 decoding within 1.8e-6 of the same weights decoded in float64, and the
# pinned values within 1.6e-6 of it, 2.2e-6 apart at one value): 5e-6 on values of order 1,
# still far below what any change of the math moves.
DECODING_ATOL = 5e-6
PINNED_DECODING = {
    "full": (
        {},
        [-2.5016174, -0.0469317, -2.4298053, 1.3699067, -2.2240696, 3.3714252, 0.0273136, -2.0747964, 0.0323133,
         -0.5774592, -1.8422247, 0.3029903, -1.822323, -0.932524, -1.6655097, 1.2283863, -0.9818832, 0.8397479,
         1.0399888, -2.2951493, 1.1108369, -0.3845601, -1.0074151, -1.1962698],
        336.191955, 2.11912683,
    ),
    "decay_slope_slope_sum": (
        {"sections": ["decay", "slope", "slope"], "fusion": "sum"},
        [-1.24338, -1.3207694, -0.7397918, -0.4488976, -1.3956923, -0.9784945, -0.5710298, -2.0744472, 1.9746497,
         -1.9320599, 1.1511399, 1.2167587, 1.1685963, -0.2063788, -1.3109121, 0.4358774, -0.6559994, -0.7139372,
         0.8540317, 1.090452, -1.4218959, -0.9962326, -3.1045694, 0.8012819],
        462.126554, 2.24700564,
    ),
    "sum_normalised_decay": (
        {"decay_norm": "sum"},
        [-0.7342682, -0.0510224, -3.2544358, 1.996735, -0.9460813, 0.0255789, 0.2176805, -0.5892203, 0.4514757,
         1.3948712, -0.514346, -0.1517735, -0.9683471, -1.960228, -0.0965065, 0.4380504, -0.6930339, 0.8314847,
         0.4318549, -0.0611997, 0.2726687, 0.1885317, 1.631464, -2.6713581],
        -35.347161, 2.13436722,
    ),
}


@pytest.mark.parametrize("name", PINNED_DECODING)
@torch.no_grad()
def test_tiny_mcsd_decoding_is_pinned(name: str) -> None:
    extra, values, total, mean_square = PINNED_DECODING[name]
    model = pinned_tiny_mcsd(name, **extra)
    ids = (torch.arange(2 * 37).reshape(2, 37) * 7) % 101
    logits, state = model.prefill(ids[:, :5])
    steps = []
    for position in range(5, 37):
        logits, state = model.step(ids[:, position], state)
        steps.append(logits)
    decoded = torch.stack(steps, dim=1)
    torch.testing.assert_close(decoded[:, ::8, :3].flatten(), torch.tensor(values), rtol=0, atol=DECODING_ATOL)
    assert decoded.double().sum().item() == pytest.approx(total, abs=1e-4)
    assert decoded.double().pow(2).mean().item() == pytest.approx(mean_square, abs=1e-7)


@torch.no_grad()
def test_weights_saved_with_a_projection_per_section_still_load() -> None:
    """Before the block had one grouped projection, each section had its own
    (``sections.i.proj.weight``, ``[C, Dc, 2 Dc]``): such weights load into ``in_proj``."""
    torch.manual_seed(0)
    model = build_model(tiny_mcsd_config(sections=["slope", "decay", "decay"])).eval()
    old_layout = {}
    for key, value in model.state_dict().items():
        if key.endswith("mixer.in_proj.weight"):
            for index, part in enumerate(value.chunk(3, dim=-1)):
                old_layout[key.replace("in_proj", f"sections.{index}.proj")] = part.clone()
        else:
            old_layout[key] = value
    fresh = build_model(model.config).eval()
    fresh.load_state_dict(old_layout)
    ids = torch.arange(30).reshape(2, 15)
    assert torch.equal(fresh(ids), model(ids))


@torch.no_grad()
def test_seeded_initialisation_is_pinned() -> None:
    """Seed 0's tiny MCSD, as :func:`mcsd.build_model` initialises it on a CPU since issue 54 (once,
    on the meta-built model's own device): a few values, the sum and the mean square of every
    parameter, computed at the commit that made it so. The embedding is drawn first; the MLP's
    down projection is a residual weight (drawn at init_std, scaled by 1 / sqrt(2 L))."""
    torch.manual_seed(0)
    model = build_model(tiny_mcsd_config())
    torch.testing.assert_close(model.embed.weight[0, :4], torch.tensor([-0.337752, -0.3457081, -0.0751736, -0.1301637]),
                               rtol=0, atol=1e-7)
    torch.testing.assert_close(model.layers[1].mlp.down.weight[0, :3], torch.tensor([0.0700378, -0.1056468, -0.0780405]),
                               rtol=0, atol=1e-7)
    values = torch.cat([parameter.flatten().double() for parameter in model.parameters()])
    assert values.numel() == 14616
    assert values.sum().item() == pytest.approx(150.348269, abs=1e-5)
    assert values.pow(2).mean().item() == pytest.approx(0.0813018201, abs=1e-9)
