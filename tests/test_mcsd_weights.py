"""The fixed slope and decay weights are the paper's Eqs. 2, 3, 8 and 9."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import relative_rms_error
from mcsd import build_model
from mcsd.models.mcsd import MCSDConfig, decay_matrix, decay_rates, section_log_decay, slope_matrix, slope_rates


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


@pytest.mark.parametrize("kind", ["slope", "decay"])
@pytest.mark.parametrize("form", ["parallel", "chunk", "recurrent"])
def test_section_history_branch_applies_the_matrix(kind: str, form: str) -> None:
    """The model's mixing of V (slope) or E (decay) is exactly W_s V or W_d E, in every form."""
    config = MCSDConfig(vocab_size=11, hidden_size=12, num_channels=3, num_layers=1, mlp_hidden_size=8,
                        chunk_size=8, sections=[kind])
    section = build_model(config).layers[0].mixer.sections[0]
    values = torch.randn(2, 21, 3, 4)  # [B, N, C, Dc]
    mixed, _ = section.mix(values, None, 0, form)
    matrix = (slope_matrix if kind == "slope" else decay_matrix)(21, 3)
    expected = torch.einsum("cnj,bjcd->bncd", matrix, values)
    assert relative_rms_error(mixed, expected) < 1e-6
