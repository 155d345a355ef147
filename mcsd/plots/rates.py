"""Each point's best learning rate in a rate sweep (zoology's protocol: every architecture read at
its own rate), shared by the comparison table, MQAR and the MAD and retrieval tasks."""

from __future__ import annotations

import numpy as np
import pandas as pd


def best_rates(runs: pd.DataFrame, keys: list[str], score: str, higher_is_better: bool) -> pd.DataFrame:
    """Per group of ``keys``: the learning rate (``lr``) whose runs' mean ``score`` is best, with
    ``lrs_tried`` and ``at_edge`` (the best is the lowest or highest rate tried: the grid does not
    bracket it). ``runs`` holds one row per run, with ``lr`` and ``seed``.

    Rates are compared on the seeds that every rate of the group ran: a seed run at some rates
    alone (the second seed added at the best rate) is an easier or harder draw of data and weights
    for every rate, and averaged in at one rate only it would move that rate against the others.
    Where the rates share no seed, each rate's mean is over all its seeds. A missing score (a run
    that diverged) counts as the worst, so a rate that diverged at any compared seed loses to every
    rate that trained; ties go to the lower rate."""
    worst = -np.inf if higher_is_better else np.inf
    chosen = []
    for key, group in runs.groupby(keys, sort=False):
        seeds = {lr: set(rate["seed"].astype(str)) for lr, rate in group.groupby("lr")}
        shared = set.intersection(*seeds.values())
        compared = group[group["seed"].astype(str).isin(shared)] if shared else group
        means = compared[score].astype(float).fillna(worst).groupby(compared["lr"]).mean()
        lr = means.idxmax() if higher_is_better else means.idxmin()
        chosen.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))), "lr": lr, "lrs_tried": len(seeds),
                       "at_edge": len(seeds) > 1 and lr in (min(seeds), max(seeds))})
    return pd.DataFrame(chosen, columns=[*keys, "lr", "lrs_tried", "at_edge"])
