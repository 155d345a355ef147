"""Scaling laws fitted with their uncertainty: ``L(N, D) = E + A N^-alpha + B D^-beta`` (Hoffmann
et al. 2022, "Chinchilla", approach 3) fitted to a sweep's loss points, bootstrap intervals of
each parameter, and the compute multiplier of one architecture over another: how many times
the compute ``C = 6 N D`` the other needs to reach the first one's loss.

The fit is Chinchilla's: a Huber loss (delta ``1e-3``) on the difference of log losses, over
``log A``, ``log B``, ``log E``, ``alpha``, ``beta`` (scipy's ``least_squares``), from the best
starting points of a grid of exponents (at each, ``E``, ``A`` and ``B`` by non-negative least
squares, where Chinchilla starts from a grid of all five); a sweep whose runs all see the same tokens fits ``L(N) = E + A
N^-alpha`` alone. The intervals resample the points with replacement and refit from the best
fit (points along one run are correlated: the intervals are then narrower than they should be,
and a sweep of three sizes barely determines five parameters: the table says how many points
and sizes each fit had).

The laws and their bootstrap draws are a sweep's result of their own (``<name>_fit_draws.json``
beside the figures, :func:`fit_sweep`'s ``saved``): 1,000 refits take about a minute per
architecture, and their last digits depend on the CPU (numpy's SIMD paths, which an ill-posed fit
carries into the intervals' third digit), so the figure and table are drawn again from the file,
byte for byte, as long as it holds the draws of the same points and settings; any other point or
setting fits again and rewrites it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
from dataclasses import dataclass

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.optimize import brentq, least_squares, nnls  # noqa: E402

from mcsd.errors import MCSDError  # noqa: E402
from mcsd.markdown import markdown_table  # noqa: E402
from mcsd.plots.files import save_figure  # noqa: E402
from mcsd.plots.runs import arch_label  # noqa: E402

HUBER_DELTA = 1e-3  # Chinchilla's, on log losses
LEVEL = 0.95  # the bootstrap intervals' coverage


@dataclass(frozen=True)
class LossLaw:
    """``L(N, D) = E + A N^-alpha + B D^-beta`` (``B = 0`` for a fit in ``N`` alone)."""

    E: float
    A: float
    alpha: float
    B: float = 0.0
    beta: float = 0.0

    def loss(self, params: np.ndarray | float, tokens: np.ndarray | float) -> np.ndarray:
        params, tokens = np.asarray(params, dtype=float), np.asarray(tokens, dtype=float)
        tokens_term = self.B * tokens ** -self.beta if self.B else 0.0
        return self.E + self.A * params ** -self.alpha + tokens_term

    @property
    def with_tokens(self) -> bool:
        return self.B != 0.0


def _terms(theta: np.ndarray, log_params: np.ndarray, log_tokens: np.ndarray | None) -> np.ndarray:
    """The law's terms in log-space, ``[terms, points]``, for ``theta`` = (log E, log A, alpha[,
    log B, beta])."""
    terms = [np.full_like(log_params, theta[0]), theta[1] - theta[2] * log_params]
    if log_tokens is not None:
        terms.append(theta[3] - theta[4] * log_tokens)
    return np.stack(terms)


def _solve(theta: np.ndarray, log_params: np.ndarray, log_tokens: np.ndarray | None,
           log_losses: np.ndarray) -> tuple[np.ndarray, float]:
    """Least Huber loss of the log-loss residuals from ``theta``: (theta, the loss)."""
    def residuals(t: np.ndarray) -> np.ndarray:
        return np.logaddexp.reduce(_terms(t, log_params, log_tokens), axis=0) - log_losses

    def jacobian(t: np.ndarray) -> np.ndarray:  # d log L / d (a term's log) is the term's share of L
        terms = _terms(t, log_params, log_tokens)
        share = np.exp(terms - np.logaddexp.reduce(terms, axis=0))
        columns = [share[0], share[1], -share[1] * log_params]
        if log_tokens is not None:
            columns += [share[2], -share[2] * log_tokens]
        return np.stack(columns, axis=1)

    result = least_squares(residuals, theta, jac=jacobian, loss="huber", f_scale=HUBER_DELTA)
    return result.x, float(result.cost)


def _law(theta: np.ndarray) -> LossLaw:
    E, A, alpha = math.exp(theta[0]), math.exp(theta[1]), float(theta[2])
    if len(theta) == 3:
        return LossLaw(E, A, alpha)
    return LossLaw(E, A, alpha, math.exp(theta[3]), float(theta[4]))


def fit_loss_law(params: np.ndarray, tokens: np.ndarray, losses: np.ndarray, with_tokens: bool | None = None,
                 start: LossLaw | None = None) -> LossLaw:
    """The law of ``losses`` at ``params`` (N) and ``tokens`` (D), one entry per point;
    ``with_tokens`` (default: whether the points' tokens differ) fits the ``D`` term too.
    From ``start`` alone if given, else from the best of a grid of starting points."""
    params, tokens, losses = (np.asarray(values, dtype=float) for values in (params, tokens, losses))
    if with_tokens is None:
        with_tokens = bool(np.ptp(np.log(tokens)) > 1e-9)
    log_params, log_losses = np.log(params), np.log(losses)
    log_tokens = np.log(tokens) if with_tokens else None
    if start is not None:
        theta = [math.log(start.E), math.log(start.A), start.alpha]
        if with_tokens:
            theta += [math.log(start.B), start.beta]
        return _law(_solve(np.array(theta), log_params, log_tokens, log_losses)[0])
    fits = [_solve(theta, log_params, log_tokens, log_losses) for theta in _starts(params, tokens, losses, with_tokens)]
    return _law(min(fits, key=lambda fit: fit[1])[0])


def _starts(params: np.ndarray, tokens: np.ndarray, losses: np.ndarray, with_tokens: bool,
            keep: int = 4) -> list[np.ndarray]:
    """The ``keep`` best starting points of a grid of exponents: at each (alpha, beta) the law
    is linear in E, A, B, solved by non-negative least squares (variable projection), and the
    points are ranked by the Huber loss of their log residuals."""
    exponents = np.linspace(0.05, 1.5, 30)
    ranked = []
    for alpha, beta in itertools.product(exponents, exponents if with_tokens else [0.0]):
        columns = [np.ones_like(params), params ** -alpha] + ([tokens ** -beta] if with_tokens else [])
        coefficients, _ = nnls(np.stack(columns, axis=1), losses)
        coefficients = np.maximum(coefficients, 1e-12)
        predicted = np.stack(columns, axis=1) @ coefficients
        residual = np.abs(np.log(predicted) - np.log(losses)) / HUBER_DELTA
        cost = np.where(residual <= 1, residual ** 2, 2 * residual - 1).sum()
        theta = [math.log(coefficients[0]), math.log(coefficients[1]), alpha]
        if with_tokens:
            theta += [math.log(coefficients[2]), beta]
        ranked.append((cost, np.array(theta)))
    ranked.sort(key=lambda item: item[0])
    return [theta for _, theta in ranked[:keep]]


def compute_multiplier(law: LossLaw, reference: LossLaw, params: float, tokens: float) -> float:
    """How many times ``6 N D`` the ``reference`` law needs to reach ``law``'s loss at
    (``params``, ``tokens``), scaling its parameters and tokens together (a law in ``N`` alone:
    its parameters, at the same tokens). ``inf`` when the reference never reaches that loss;
    below 1 when it is already better."""
    target = float(law.loss(params, tokens))
    if target <= reference.E:
        return math.inf
    power = 2 if reference.with_tokens else 1  # compute grows as s^2 with both scaled by s, else as s

    def gap(log_scale: float) -> float:
        scale = math.exp(log_scale)
        return float(reference.loss(params * scale, tokens * (scale if reference.with_tokens else 1.0))) - target

    low, high = -20.0, 20.0
    if gap(high) > 0:
        return math.inf
    if gap(low) < 0:
        return 0.0
    return math.exp(power * brentq(gap, low, high))


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float


def bootstrap(params: np.ndarray, tokens: np.ndarray, losses: np.ndarray, fit: LossLaw, samples: int = 1000,
              seed: int = 0) -> list[LossLaw]:
    """``samples`` refits of the points drawn with replacement, each started from ``fit``."""
    rng = np.random.default_rng(seed)
    params, tokens, losses = (np.asarray(values, dtype=float) for values in (params, tokens, losses))
    draws = rng.integers(0, len(losses), (samples, len(losses)))
    return [fit_loss_law(params[draw], tokens[draw], losses[draw], fit.with_tokens, start=fit) for draw in draws]


def interval(value: float, draws: list[float]) -> Interval:
    """``value`` with the central ``LEVEL`` percentile interval of its bootstrap ``draws``."""
    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(np.asarray(draws, dtype=float), [tail, 100 - tail])
    return Interval(value, float(low), float(high))


def parameter_intervals(fit: LossLaw, draws: list[LossLaw]) -> dict[str, Interval]:
    """Each parameter of ``fit`` with its bootstrap interval."""
    names = [field.name for field in dataclasses.fields(LossLaw)]
    if not fit.with_tokens:
        names = names[:3]
    return {name: interval(getattr(fit, name), [getattr(draw, name) for draw in draws]) for name in names}


FIT_FROM = 0.2  # the points of a run from this fraction of its tokens on (the warm-up's transient left out)
REFERENCE = "transformer"  # the architecture the compute multipliers are taken over


@dataclass
class ArchitectureFit:
    """One architecture's fit: its law, each parameter's interval, the points it had, and
    its compute multiplier over :data:`REFERENCE` (``None`` for the reference itself)."""

    arch: str
    law: LossLaw
    intervals: dict[str, Interval]
    points: int
    sizes: int
    at: tuple[float, float]  # (N, D) of its largest run's last point, where the multiplier is read
    multiplier: Interval | None = None


DRAWS_FORMAT = 1  # the saved draws' layout and the fit's method: a file of another is fitted again


def draws_path(output_dir: str | Path, name: str) -> Path:
    """Where a sweep's laws and bootstrap draws are saved, beside ``<name>_fit.png`` (:func:`plot_fit`)."""
    return Path(output_dir) / f"{name}_fit_draws.json"


def _saved_fits(path: Path | None, key: dict) -> dict[str, tuple[LossLaw, list[LossLaw]]] | None:
    """Each architecture's law and draws from ``path`` when it was written for ``key``, else None."""
    if path is None or not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict) or saved.get("key") != key:
            return None
        return {arch: (LossLaw(*entry["law"]), [LossLaw(*draw) for draw in entry["draws"]])
                for arch, entry in saved["architectures"].items()}
    except (OSError, ValueError, KeyError, TypeError):  # unreadable or edited: fitted again
        return None


def _save_fits(path: Path, key: dict, fitted: dict[str, tuple[LossLaw, list[LossLaw]]]) -> None:
    """Write the laws and draws for ``key`` to ``path`` (complete or not at all)."""
    def fields(law: LossLaw) -> list[float]:
        return [getattr(law, field.name) for field in dataclasses.fields(LossLaw)]

    saved = {"key": key, "architectures": {arch: {"law": fields(law), "draws": [fields(draw) for draw in draws]}
                                           for arch, (law, draws) in fitted.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(saved, separators=(",", ":")) + "\n")
    os.replace(partial, path)


def fit_sweep(rows: pd.DataFrame, samples: int = 1000, seed: int = 0, saved: Path | None = None) -> list[ArchitectureFit]:
    """Fit every architecture of a sweep's long-format ``rows`` (:func:`mcsd.plots.runs.load_csv_runs`):
    validation losses against non-embedding parameters and tokens, each run's points from
    :data:`FIT_FROM` of its tokens on; the multipliers over :data:`REFERENCE` with intervals from
    the same bootstrap draws (the i-th draw of each architecture together). ``saved``: the laws
    and draws are read from this file when it holds those of the same points, ``samples``,
    ``seed`` and method, else fitted and written to it."""
    points = rows[(rows["metric"] == "val/loss") & (rows["tokens"] > 0)]
    points = points[points["tokens"] >= FIT_FROM * points.groupby("run")["tokens"].transform("max")]
    if points.empty:
        raise MCSDError("no validation loss after the first tokens in this sweep: nothing to fit")
    columns = {}
    for arch, own in points.groupby("arch", sort=False):
        params, tokens, losses = own["params_non_embedding"].to_numpy(float), own["tokens"].to_numpy(float), \
            own["value"].to_numpy(float)
        if np.isnan(params).any():
            raise MCSDError(f"runs of {arch} did not log model/params_non_embedding: train them again to fit them")
        if own["params_non_embedding"].nunique() < 2:
            raise MCSDError(f"{arch} has runs of one size only: a scaling fit needs at least two sizes")
        columns[arch] = params, tokens, losses
    key = {"format": DRAWS_FORMAT, "huber_delta": HUBER_DELTA, "fit_from": FIT_FROM, "samples": samples, "seed": seed,
           "points": {arch: np.stack(values, axis=1).tolist() for arch, values in columns.items()}}
    fitted = _saved_fits(saved, key)
    if fitted is None:
        fitted = {}
        for arch, (params, tokens, losses) in columns.items():
            law = fit_loss_law(params, tokens, losses)
            fitted[arch] = law, bootstrap(params, tokens, losses, law, samples, seed)
        if saved is not None:
            _save_fits(saved, key, fitted)
    fits, draws = [], {}
    for arch, (params, tokens, _) in columns.items():
        law, draws[arch] = fitted[arch]
        fits.append(ArchitectureFit(arch, law, parameter_intervals(law, draws[arch]), len(params), len(np.unique(params)),
                                    (float(params.max()), float(tokens[params == params.max()].max()))))
    reference = next((fit for fit in fits if fit.arch == REFERENCE), None)
    for fit in fits:
        if reference is None or fit is reference:
            continue
        value = compute_multiplier(fit.law, reference.law, *fit.at)
        fit.multiplier = interval(value, [compute_multiplier(own, other, *fit.at)
                                          for own, other in zip(draws[fit.arch], draws[REFERENCE])])
    return fits


def _cell(found: Interval) -> str:
    def number(value: float) -> str:
        return "inf" if math.isinf(value) else f"{value:.3g}"
    return f"{number(found.value)} [{number(found.low)}, {number(found.high)}]"


def markdown_fit_table(fits: list[ArchitectureFit]) -> str:
    """Each architecture's law with the bootstrap intervals, and its compute multiplier."""
    names = ["E", "A", "alpha", "B", "beta"]
    rows = []
    for fit in fits:
        cells = [_cell(fit.intervals[name]) if name in fit.intervals else "-" for name in names]
        multiplier = "-" if fit.multiplier is None else \
            f"{_cell(fit.multiplier)} (at {fit.at[0] / 1e6:.2f}M, {fit.at[1] / 1e6:.2f}M tokens)"
        rows.append([arch_label(fit.arch), f"{fit.points} ({fit.sizes})", *cells, multiplier])
    header = ["architecture", "points (sizes)", *names, f"compute multiplier over {arch_label(REFERENCE)} (at N, D)"]
    return markdown_table(header, rows) + f"\n\nValues [{LEVEL:.0%} bootstrap interval]; L(N, D) = E + A N^-alpha + B D^-beta " \
                              "with N the non-embedding parameters and D the training tokens.\n"


def plot_fit(rows: pd.DataFrame, fits: list[ArchitectureFit], output_dir: str | Path, name: str) -> list[Path]:
    """Each run's validation loss against tokens (points) with its architecture's fitted law at
    its size (line), one panel per architecture; ``<name>_fit.png/.pdf`` and ``<name>_fit.md``."""
    figure, axes = plt.subplots(1, len(fits), figsize=(5.5 * len(fits), 4.4), squeeze=False, sharey=True)
    validation = rows[(rows["metric"] == "val/loss") & (rows["tokens"] > 0)]
    for ax, fit in zip(axes[0], fits):
        own = validation[validation["arch"] == fit.arch]
        sizes = sorted(own["params_non_embedding"].unique())
        for index, size in enumerate(sizes):
            run = own[own["params_non_embedding"] == size]
            color = plt.cm.viridis(index / max(len(sizes) - 1, 1))
            ax.scatter(run["tokens"], run["value"], color=color, s=12, label=f"N = {size / 1e6:.2f}M")
            tokens = np.geomspace(run["tokens"].min(), run["tokens"].max(), 100)
            ax.plot(tokens, fit.law.loss(size, tokens), color=color)
        ax.set(xscale="log", xlabel="training tokens", title=arch_label(fit.arch))
        ax.grid(True, alpha=0.3, which="both")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("validation loss")
    figure.suptitle(f"{name.replace('_', ' ')}: fitted L(N, D) = E + A N^-alpha + B D^-beta (lines), the runs (points)")
    output_dir = Path(output_dir)
    paths = save_figure(figure, output_dir, f"{name}_fit")
    table = output_dir / f"{name}_fit.md"
    table.write_text(markdown_fit_table(fits))
    return [*paths, table]
