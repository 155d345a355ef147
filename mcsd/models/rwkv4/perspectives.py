"""Multiple temporal perspectives (Dumitru et al. 2024) on RWKV-4: P residual streams through
every layer, sharing every weight but the token-shift mixes mu (one row per perspective), combined
before the LM head by ``alpha = softmax(W_agg mean_i h_i + b)``, ``sum_i alpha_i h_i`` (the
paper's Eqs. 6-7; the LM head is linear, so weighting its outputs equals weighting its inputs),
``h_i`` being stream i's final-normed state. The streams run stacked along the batch, so every
form and the decoding state (P times larger) need nothing else."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def mix(shifted: torch.Tensor, x: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """``mu x + (1 - mu) x_{t-1}`` per perspective: ``x, shifted [P * B, N, D]`` or ``[P * B, D]``
    (stream-major), ``mu [P, D]``."""
    count = mu.shape[0]
    mu = mu.view(count, *([1] * (x.dim() - 1)), -1)
    return torch.lerp(shifted.unflatten(0, (count, -1)), x.unflatten(0, (count, -1)), mu).flatten(0, 1)


class PerspectiveMixes(nn.Module):
    """A module whose ``mix_*`` parameters hold one row per perspective. Loading weights saved
    with one perspective copies that row into every perspective (the paper's recipe: start each
    perspective from the trained model's mu); mixes saved as ``[D]`` (RWKV-4 before the switch
    existed) are that one row."""

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        for name, param in self.named_parameters(recurse=False):
            saved = state_dict.get(prefix + name)
            if not name.startswith("mix_") or saved is None:
                continue
            if saved.dim() == 1:
                saved = saved[None]
            if saved.shape[0] == 1 < param.shape[0]:
                saved = saved.expand(param.shape[0], -1).clone()
            state_dict[prefix + name] = saved
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class Perspectives(nn.Module):
    """P > 1 streams: the embedding copied into each, merged by softmax weights from ``aggregator``
    (W_agg [P, D] and bias b [P]); W_agg drawn from Normal(0, ``init_std``) (the paper's noise,
    std 0.01), b = 0."""

    def __init__(self, count: int, width: int, init_std: float) -> None:
        super().__init__()
        self.count, self.init_std = count, init_std
        self.aggregator = nn.Linear(width, count)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.aggregator.weight, std=self.init_std)
        nn.init.zeros_(self.aggregator.bias)

    def split(self, embedded: torch.Tensor) -> torch.Tensor:
        return embedded.repeat(self.count, 1, 1)

    def weights(self, hidden: torch.Tensor) -> torch.Tensor:
        """alpha ``[B, N, P]``: each position's weights of the perspectives."""
        streams = hidden.unflatten(0, (self.count, -1))
        return torch.softmax(self.aggregator(streams.mean(0)).float(), dim=-1)

    def merge(self, hidden: torch.Tensor) -> torch.Tensor:
        streams = hidden.unflatten(0, (self.count, -1))
        return torch.einsum("bnp,pbnd->bnd", self.weights(hidden).to(hidden.dtype), streams)
