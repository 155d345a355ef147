"""Shared helpers for the tests."""

from __future__ import annotations

import pytest
import torch


def relative_rms_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """RMS of the difference over RMS of the expected value (the spec's agreement measure)."""
    expected = expected.double()
    return ((actual.double() - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt()).item()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
