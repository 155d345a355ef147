"""mcsd.plots.rates.best_rates: each point's best learning rate, rates compared on shared seeds."""

from __future__ import annotations

import math

import pandas as pd

from mcsd.plots.rates import best_rates


def _runs(rows: list[tuple[str, float, int, float]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["arch", "lr", "seed", "ppl"])


def test_rates_are_compared_on_the_seeds_they_share() -> None:
    # The comparison's case: four rates at seed 0, then seed 1 (a harder draw) at the best rate alone.
    # Averaged in, seed 1 would hand the best to 4.64e-2 (91.6 > 88.7); on seed 0, 1e-2 stays best.
    runs = _runs([("mcsd", 1e-4, 0, 772.0), ("mcsd", 2.15e-3, 0, 91.4), ("mcsd", 1e-2, 0, 87.6),
                  ("mcsd", 1e-2, 1, 95.6), ("mcsd", 4.64e-2, 0, 88.7),
                  # no seed shared by every rate: each rate's mean over its own seeds (75 < 80)
                  ("rwkv4", 1e-3, 0, 80.0), ("rwkv4", 1e-2, 1, 70.0), ("rwkv4", 1e-2, 2, 80.0)])
    best = best_rates(runs, ["arch"], "ppl", higher_is_better=False).set_index("arch")
    assert best.loc["mcsd"].tolist() == [1e-2, 4, False]
    assert best.loc["rwkv4"].tolist() == [1e-2, 2, True]


def test_a_diverged_run_loses_and_the_edges_are_marked() -> None:
    # Accuracy (higher is better): 1e-2's second seed diverged (no score), so 1e-3 wins though 1e-2's
    # other seed scored more; ties go to the lower rate; one rate tried is never at an edge.
    runs = pd.DataFrame([("a", 1e-4, 0, 0.1), ("a", 1e-4, 1, 0.1), ("a", 1e-3, 0, 0.5), ("a", 1e-3, 1, 0.4),
                         ("a", 1e-2, 0, 0.9), ("a", 1e-2, 1, math.nan),
                         ("b", 1e-3, 0, 0.3), ("b", 1e-2, 0, 0.3), ("c", 1e-3, 0, 0.2)],
                        columns=["curve", "lr", "seed", "accuracy"])
    best = best_rates(runs, ["curve"], "accuracy", higher_is_better=True).set_index("curve")
    assert best.loc["a"].tolist() == [1e-3, 3, False]
    assert best.loc["b"].tolist() == [1e-3, 2, True]
    assert best.loc["c"].tolist() == [1e-3, 1, False]
    assert best_rates(runs.iloc[:0], ["curve"], "accuracy", higher_is_better=True).columns.tolist() == [
        "curve", "lr", "lrs_tried", "at_edge"]
