"""The fixed slope and decay weights are the paper's Eqs. 2, 3, 8 and 9; the decay settings
(``decay_norm``, ``decay_norm_gain_init``) do what they say."""

from __future__ import annotations

import math
import re

import pytest
import torch

import mcsd
from helpers.models import relative_rms_error
from mcsd.ops.context import ForwardContext
from mcsd import build_model
from mcsd.models.mcsd import MCSDConfig, decay_matrix, decay_rates, section_log_decay, slope_matrix, slope_rates
from mcsd.ops.exp_filter import filter_histories


def mix(section: torch.nn.Module, values: torch.Tensor, form: str = "chunk") -> tuple[torch.Tensor, torch.Tensor]:
    """A section's history branch alone, from the sequence start (what its block filters)."""
    return filter_histories([values], [section.history], None, 0, context=ForwardContext(form, chunk_size=8))[0]


def test_slope_rates_are_eq2() -> None:
    # C = 4: beta_i = (2^(-8/4))^(i+1) = 2^(-2(i+1)).
    assert slope_rates(4) == [0.25, 0.0625, 0.015625, 0.00390625]
    assert slope_rates(10)[-1] == pytest.approx(2.0**-8)


def test_decay_rates_are_eq8() -> None:
    assert decay_rates(4) == [1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128, 1 - 1 / 256]


def test_slope_matrix_is_eq3() -> None:
    """Written out for N = 4, C = 2 (beta = 1/16, 1/256): row 0 is token 0 itself, row n
    averages tokens j < n with weights exp(-(n-j) beta), normalised."""
    expected = torch.zeros(2, 4, 4, dtype=torch.float64)
    for c, beta in enumerate([1 / 16, 1 / 256]):
        e1, e2, e3 = math.exp(-beta), math.exp(-2 * beta), math.exp(-3 * beta)
        expected[c, 0, 0] = 1.0
        expected[c, 1, 0] = 1.0
        expected[c, 2, :2] = torch.tensor([e2, e1]) / (e2 + e1)
        expected[c, 3, :3] = torch.tensor([e3, e2, e1]) / (e3 + e2 + e1)
    assert torch.allclose(slope_matrix(4, 2).double(), expected, atol=1e-7)


def test_slope_matrix_is_the_softmax_of_eq3_as_printed() -> None:
    """Eq. 3 literally: softmax over rows of [[1, -inf..], [-beta, -inf..], .., [(-N+1) beta, .., -beta, -inf]]."""
    length, channels = 7, 3
    for c, beta in enumerate(slope_rates(channels)):
        logits = torch.full((length, length), -math.inf, dtype=torch.float64)
        logits[0, 0] = 1.0
        for n in range(1, length):
            for j in range(n):
                logits[n, j] = -(n - j) * beta
        assert torch.allclose(slope_matrix(length, channels)[c].double(), logits.softmax(-1), atol=1e-7)


def test_decay_matrix_is_eq9() -> None:
    """Written out for N = 4, C = 2 (alpha = 1 - 2^-5, 1 - 2^-6), before the RMSNorm."""
    expected = torch.zeros(2, 4, 4, dtype=torch.float64)
    for c, alpha in enumerate([1 - 2**-5, 1 - 2**-6]):
        expected[c, 0, 0] = 1.0
        expected[c, 1, 0] = alpha
        expected[c, 2, :2] = torch.tensor([alpha**2, alpha])
        expected[c, 3, :3] = torch.tensor([alpha**3, alpha**2, alpha])
    assert torch.allclose(decay_matrix(4, 2).double(), expected, atol=1e-7)


def test_log_decays_are_fp32_and_distinct_from_one() -> None:
    """log(alpha) is kept in fp32: alpha itself would round to 1.0 in bf16 for i >= 4."""
    log_alpha = section_log_decay("decay", 12, torch.device("cpu"))
    assert log_alpha.dtype == torch.float32
    assert (log_alpha < 0).all()
    expected = torch.tensor([math.log1p(-(2.0 ** (-5 - i))) for i in range(12)], dtype=torch.float64)
    assert torch.allclose(log_alpha.double(), expected, rtol=1e-6, atol=0)


MATRICES = {"slope": lambda: slope_matrix(21, 3), "decay": lambda: decay_matrix(21, 3),
            "decay+sum": lambda: decay_matrix(21, 3, "sum")}


@pytest.mark.parametrize("case", MATRICES)
@pytest.mark.parametrize("form", ["parallel", "chunk", "recurrent"])
def test_section_history_branch_applies_the_matrix(case: str, form: str) -> None:
    """The model's mixing of V (slope) or E (decay) is exactly W_s V or W_d E (rows divided by
    their sums under ``decay_norm: sum``), in every form."""
    kind, _, decay_norm = case.partition("+")
    config = MCSDConfig(vocab_size=11, hidden_size=12, num_channels=3, num_layers=1, mlp_hidden_size=8,
                        chunk_size=8, sections=[kind], decay_norm=decay_norm or "rmsnorm")
    section = build_model(config).layers[0].mixer.sections[0]
    values = torch.randn(2, 21, 3, 4)  # [B, N, C, Dc]
    mixed, _ = mix(section, values, form)
    expected = torch.einsum("cnj,bjcd->bncd", MATRICES[case](), values)
    assert relative_rms_error(mixed, expected) < 1e-6


def test_sum_normalised_decay_rows_are_weighted_averages() -> None:
    matrix = decay_matrix(40, 4, "sum")
    torch.testing.assert_close(matrix.sum(-1), torch.ones(4, 40))
    assert torch.equal(matrix[:, 1, 0], torch.ones(4))  # row 1: token 0 alone
    later = torch.ones(40, 40, dtype=torch.bool).triu()
    later[0, 0] = False  # row 0 is token 0 itself
    assert (matrix[:, later] == 0).all()  # otherwise strictly earlier tokens only


def decay_config(**fields: object) -> MCSDConfig:
    return MCSDConfig(vocab_size=11, hidden_size=12, num_channels=3, num_layers=2, mlp_hidden_size=8, **fields)


@pytest.mark.parametrize("gain", [1.0, 0.1, 0.01])
def test_decay_norm_gain_starts_at_its_setting(gain: float) -> None:
    model = build_model(decay_config(sections=["slope", "decay", "decay"], decay_norm_gain_init=gain))
    norms = [section.norm for layer in model.layers for section in layer.mixer.sections if section.kind == "decay"]
    assert len(norms) == 4 and all(torch.equal(norm.weight, torch.full((3, 4), gain)) for norm in norms)
    assert all(section.norm is None for layer in model.layers for section in layer.mixer.sections
               if section.kind == "slope")


@torch.no_grad()
def test_decay_branch_output_scales_with_the_initial_gain() -> None:
    """The same weights (same seed) with gain g: the decay branch is exactly g times the gain-1 one."""
    x = torch.randn(2, 30, 3, 4)
    outputs = {}
    for gain in (1.0, 0.01):
        torch.manual_seed(0)
        section = build_model(decay_config(sections=["decay"], decay_norm_gain_init=gain)).layers[0].mixer.sections[0]
        outputs[gain] = section.gate(mix(section, x)[0], x)
    torch.testing.assert_close(outputs[0.01], 0.01 * outputs[1.0], rtol=1e-6, atol=0)
    assert outputs[1.0].pow(2).mean().sqrt() > 0.3  # unit-scale features times sigmoid(F) ~ 0.5


def test_sum_normalised_decay_has_no_gain_and_starts_small() -> None:
    summed = build_model(decay_config(decay_norm="sum"))
    assert mcsd.count_parameters(decay_config()) - mcsd.count_parameters(decay_config(decay_norm="sum")) == 2 * 12
    # one gain of C * Dc per layer fewer
    assert all(section.norm is None for layer in summed.layers for section in layer.mixer.sections)
    mixer = summed.layers[0].mixer
    current, history = mixer.section_inputs(torch.randn(2, 30, 12))[1]
    theta = mixer.sections[1].gate(mix(mixer.sections[1], history)[0], current)
    assert theta.pow(2).mean().sqrt() < 0.05  # an average of E = W_e x (std 0.02 weights), gated


@pytest.mark.parametrize(("fields", "message"), [
    ({"decay_norm": "layernorm"}, "model.decay_norm='layernorm' is unknown: use rmsnorm or sum"),
    ({"decay_norm_gain_init": 0.0}, "model.decay_norm_gain_init=0.0 must be positive"),
])
def test_bad_decay_settings_are_named(fields: dict, message: str) -> None:
    with pytest.raises(mcsd.ConfigError, match=re.escape(message)):
        decay_config(**fields)
