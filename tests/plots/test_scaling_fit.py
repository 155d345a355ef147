"""Scaling-law fits (mcsd/plots/scaling_fit.py): known laws recovered from synthetic curves, the
compute multiplier against its closed form, and bootstrap intervals that cover the truth."""

from __future__ import annotations

import dataclasses
import json
import math

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mcsd.errors import MCSDError
from mcsd.plots import scaling_fit
from mcsd.plots.scaling_fit import (LossLaw, bootstrap, compute_multiplier, draws_path, fit_loss_law, fit_sweep,
                                    markdown_fit_table, parameter_intervals, plot_fit)

CHINCHILLA = LossLaw(E=1.69, A=406.4, alpha=0.34, B=410.7, beta=0.28)  # Hoffmann et al. 2022's fit


def curves(law: LossLaw, noise: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Five model sizes (1e6-1e9 parameters), each evaluated at 12 token counts (1e8-1e11),
    the losses multiplied by ``exp(noise * normal)``."""
    params, tokens = np.meshgrid(np.logspace(6, 9, 5), np.logspace(8, 11, 12), indexing="ij")
    params, tokens = params.ravel(), tokens.ravel()
    losses = law.loss(params, tokens) * np.exp(noise * np.random.default_rng(seed).standard_normal(params.size))
    return params, tokens, losses


SWEEP_LAWS = {"mcsd": LossLaw(2.0, 300.0, 0.35, 200.0, 0.3), "transformer": LossLaw(2.0, 450.0, 0.35, 300.0, 0.3)}


def sweep_rows() -> pd.DataFrame:
    """A sweep's long-format rows: val/loss points of runs of three sizes per architecture of
    :data:`SWEEP_LAWS` (the Transformer's law needing more compute), eight token counts each."""
    records = []
    for arch, law in SWEEP_LAWS.items():
        for size in (1e6, 4e6, 1.6e7):
            for tokens in np.linspace(2e8, 1e9, 8):
                records.append({"run": f"{arch}-{size}", "metric": "val/loss", "tokens": tokens, "arch": arch,
                                "params_non_embedding": size, "value": float(law.loss(size, tokens))})
    return pd.DataFrame(records)


@pytest.mark.parametrize("noise", [0.0, 0.002])
def test_a_known_law_is_recovered_within_five_percent(noise: float) -> None:
    fit = fit_loss_law(*curves(CHINCHILLA, noise))
    assert fit.with_tokens
    for field in dataclasses.fields(LossLaw):
        assert getattr(fit, field.name) == pytest.approx(getattr(CHINCHILLA, field.name), rel=0.05), field.name


def test_a_sweep_at_one_token_count_fits_the_parameters_alone() -> None:
    law = LossLaw(E=2.0, A=50.0, alpha=0.3)
    params = np.logspace(5, 8, 6)
    fit = fit_loss_law(params, np.full(6, 1e9), law.loss(params, 1e9))
    assert not fit.with_tokens and fit.B == 0.0
    assert (fit.E, fit.A, fit.alpha) == pytest.approx((2.0, 50.0, 0.3), rel=0.05)


def test_the_compute_multiplier_matches_its_closed_form() -> None:
    """Two laws in N alone that differ only in A: the reference reaches ``law``'s loss at N s with
    ``A_ref (N s)^-alpha = A N^-alpha``, so s = (A_ref / A)^(1 / alpha); the same with both terms
    scaled (``A`` and ``B`` both larger by a factor k, equal exponents: s = k^(1/alpha), compute s^2)."""
    law, reference = LossLaw(2.0, 50.0, 0.3), LossLaw(2.0, 80.0, 0.3)
    assert compute_multiplier(law, reference, 1e6, 1e9) == pytest.approx((80 / 50) ** (1 / 0.3), rel=1e-6)
    assert compute_multiplier(reference, law, 1e6, 1e9) == pytest.approx((50 / 80) ** (1 / 0.3), rel=1e-6)
    both = LossLaw(1.7, 400.0, 0.3, 300.0, 0.3)
    larger = dataclasses.replace(both, A=800.0, B=600.0)
    assert compute_multiplier(both, larger, 1e8, 1e10) == pytest.approx(2 ** (2 / 0.3), rel=1e-6)
    assert compute_multiplier(LossLaw(1.0, 10.0, 0.3), LossLaw(1.5, 10.0, 0.3), 1e6, 1e9) == math.inf


def test_bootstrap_intervals_cover_the_law_the_points_came_from() -> None:
    params, tokens, losses = curves(CHINCHILLA, 0.002, seed=1)
    fit = fit_loss_law(params, tokens, losses)
    intervals = parameter_intervals(fit, bootstrap(params, tokens, losses, fit, samples=50))
    assert list(intervals) == ["E", "A", "alpha", "B", "beta"]
    for name, found in intervals.items():
        assert found.low <= found.value <= found.high
        assert found.low < found.high
    assert intervals["E"].low <= CHINCHILLA.E <= intervals["E"].high


def test_a_sweeps_fit_gives_the_multiplier_of_its_laws_and_refuses_one_size(tmp_path: Path) -> None:
    """``fit_sweep`` on a sweep's long-format rows (val/loss points of runs of three sizes per
    architecture, the Transformer's law needing more compute): each law found, the multiplier
    near the true laws' and inside its interval; the figure and table written; an architecture of
    one size refused in one line."""
    rows = sweep_rows()
    fits = fit_sweep(rows, samples=40)
    assert [fit.arch for fit in fits] == ["mcsd", "transformer"] and fits[1].multiplier is None
    for fit in fits:
        assert fit.law.alpha == pytest.approx(SWEEP_LAWS[fit.arch].alpha, rel=0.05) and fit.points == 8 * 3
    expected = compute_multiplier(SWEEP_LAWS["mcsd"], SWEEP_LAWS["transformer"], 1.6e7, 1e9)
    assert fits[0].at == (1.6e7, 1e9)
    assert fits[0].multiplier.value == pytest.approx(expected, rel=0.05)
    assert fits[0].multiplier.low <= fits[0].multiplier.value <= fits[0].multiplier.high
    paths = plot_fit(rows, fits, tmp_path, "sweep")
    assert [path.name for path in paths] == ["sweep_fit.png", "sweep_fit.pdf", "sweep_fit.md"]
    assert paths[-1].read_text() == markdown_fit_table(fits) and "| MCSD | 24 (3) |" in paths[-1].read_text()
    with pytest.raises(MCSDError, match="mcsd has runs of one size only"):
        fit_sweep(rows[rows["params_non_embedding"] == 1e6])


def test_a_sweeps_fit_is_saved_and_read_back_while_its_points_and_settings_stay(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``fit_sweep(saved=...)`` writes the laws and bootstrap draws; called again on the same points
    and settings it reads them (no refit) and gives equal fits, so the same table; another sample
    count, seed, point or a damaged or edited file fits again and rewrites the file."""
    rows, saved = sweep_rows(), draws_path(tmp_path, "sweep")
    assert saved.name == "sweep_fit_draws.json"
    fits = fit_sweep(rows, samples=20, saved=saved)
    written = json.loads(saved.read_text())
    assert sorted(written["architectures"]) == ["mcsd", "transformer"]
    assert len(written["architectures"]["mcsd"]["draws"]) == 20 and written["key"]["samples"] == 20
    refits = []
    real_bootstrap = scaling_fit.bootstrap

    def counted(*args: object, **kwargs: object) -> list[LossLaw]:
        refits.append(args[-2:])
        return real_bootstrap(*args, **kwargs)

    monkeypatch.setattr(scaling_fit, "bootstrap", counted)
    again = fit_sweep(rows, samples=20, saved=saved)
    assert refits == [] and again == fits and markdown_fit_table(again) == markdown_fit_table(fits)
    fit_sweep(rows, samples=20, seed=1, saved=saved)
    assert len(refits) == 2 and json.loads(saved.read_text())["key"]["seed"] == 1
    changed = rows.copy()
    changed.loc[0, "value"] *= 1.01
    fit_sweep(changed, samples=20, seed=1, saved=saved)
    assert len(refits) == 4
    fit_sweep(changed, samples=20, seed=1, saved=saved)
    assert len(refits) == 4  # the changed points' fit, saved in its turn
    saved.write_text('{"key": ')
    assert fit_sweep(rows, samples=20, saved=saved) == fits and len(refits) == 6
    edited = json.loads(saved.read_text())
    del edited["architectures"]["mcsd"]["draws"]
    saved.write_text(json.dumps(edited))
    assert fit_sweep(rows, samples=20, saved=saved) == fits and len(refits) == 8
    assert not list(tmp_path.glob(".*partial"))
