"""The layers that several architectures build from: per-channel projections and norms, the
GeGLU MLP, the one residual stream, and the weight FLOPs of a module."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GroupedLinear(nn.Module):
    """Per-channel projections ``W in R^{C x Din x Dout}`` (the paper's Eqs. 1 and 7):
    ``[..., C, Din] -> [..., C, Dout]``, each channel with its own matrix, no bias."""

    def __init__(self, num_channels: int, in_width: int, out_width: int, init_std: float) -> None:
        super().__init__()
        self.init_std = init_std
        self.weight = nn.Parameter(torch.empty(num_channels, in_width, out_width))

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=self.init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("...ci,cio->...co", x, self.weight)


class ChannelRMSNorm(nn.Module):
    """RMSNorm over each channel's ``Dc`` features separately, with a gain per feature
    (as RetNet's per-head GroupNorm); input ``[..., C, Dc]``."""

    def __init__(self, num_channels: int, width: int, eps: float, gain_init: float = 1.0) -> None:
        super().__init__()
        self.eps = eps
        self.gain_init = gain_init
        self.weight = nn.Parameter(torch.empty(num_channels, width))

    def reset_parameters(self) -> None:
        nn.init.constant_(self.weight, self.gain_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), eps=self.eps) * self.weight


class GatedMLP(nn.Module):
    """GeGLU MLP (Shazeer 2020): ``W_down(gelu(W_gate x) * W_up x)``; Normal(0, init_std)."""

    def __init__(self, hidden_size: int, mlp_hidden_size: int, init_std: float) -> None:
        super().__init__()
        self.init_std = init_std
        self.gate_up = nn.Linear(hidden_size, 2 * mlp_hidden_size, bias=False)
        self.down = nn.Linear(mlp_hidden_size, hidden_size, bias=False)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.gate_up.weight, std=self.init_std)
        nn.init.normal_(self.down.weight, std=self.init_std)

    def residual_weights(self) -> list[nn.Parameter]:
        """The weights that write into the residual stream (drawn at init_std, scaled by the skeleton)."""
        return [self.down.weight]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.gelu(gate) * up)


class OneStream(nn.Module):
    """The residual stream the layers run on: the embedded tokens themselves. An architecture
    with several streams (RWKV-4's perspectives) splits the embedding into them, stacked along
    the batch, and merges their final-normed states before the LM head."""

    count = 1  # the number of streams

    def reset_parameters(self) -> None:
        pass

    def split(self, embedded: torch.Tensor) -> torch.Tensor:
        """``[B, N, D]`` -> the streams, ``[S * B, N, D]`` (stream-major)."""
        return embedded

    def merge(self, hidden: torch.Tensor) -> torch.Tensor:
        """The streams' final-normed states ``[S * B, N, D]`` -> what the LM head reads, ``[B, N, D]``."""
        return hidden


def weight_flops_per_token(module: nn.Module) -> int:
    """2 FLOPs (a multiply and an add) for every weight that one token's forward pass through
    ``module`` multiplies: the weights of its ``nn.Linear`` and :class:`GroupedLinear` modules,
    or, for a module that reads its weights otherwise (CDMoE's selected experts), what its own
    ``weight_flops_per_token()`` says. Norm gains and other elementwise parameters are left out."""
    own = getattr(module, "weight_flops_per_token", None)
    if own is not None:
        return own()
    if isinstance(module, (nn.Linear, GroupedLinear)):
        return 2 * module.weight.numel()
    return sum(weight_flops_per_token(child) for child in module.children())
