"""The short causal convolution that recurrent mixers put before their token mixing (H3's
shift, Mamba's ``d_conv``, flash-linear-attention's ``ShortConvolution``).

Per feature ``d``: ``y[n, d] = silu(sum_{t<K} w[d, t] x[n - t, d])``, a depthwise filter over the
token and the ``K - 1`` before it (none before a document's start), then SiLU as Mamba and fla
apply it. It lets the mixer see its neighbours' content directly, which associative recall needs
(zoology: the short convolution is what turns a gated linear recurrence into one that recalls).

Decoding state: the last ``K - 1`` inputs, ``[B, K - 1, D]`` fp32 as every recurrent state (fp64
in an fp64 model; exact copies of 16-bit inputs, nothing accumulated). It is the same computation in every form of the mixer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mcsd.ops.common import state_dtype


class ShortConvolution(nn.Module):
    """Depthwise causal convolution of ``kernel_size`` taps over ``width`` features, then SiLU.
    Initialisation: nn.Conv1d's (uniform in +-1/sqrt(kernel_size)), no bias."""

    def __init__(self, width: int, kernel_size: int) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.weight = nn.Parameter(torch.empty(width, kernel_size))  # [:, t]: the token t positions back

    def reset_parameters(self) -> None:
        bound = 1 / math.sqrt(self.kernel_size)
        nn.init.uniform_(self.weight, -bound, bound)

    def weight_flops_per_token(self) -> int:
        return 2 * self.weight.numel()

    def init_state(self, x: torch.Tensor) -> torch.Tensor:
        """The state before the first token: no earlier inputs, ``[B, K - 1, D]`` of zeros."""
        return x.new_zeros(x.shape[0], self.kernel_size - 1, x.shape[-1], dtype=state_dtype(x))

    def forward(
        self, x: torch.Tensor, state: torch.Tensor | None, position_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[B, N, D]`` after ``state`` (the inputs before it; ``None`` at a sequence's start)
        -> (``y`` ``[B, N, D]``, the last ``K - 1`` inputs). With ``position_ids`` ``[B, N]`` (documents
        of a packed row, each token's position in its own), a tap reaches back only inside the
        token's document, and the state returned holds the last document's inputs alone."""
        length = x.shape[1]
        past = self.kernel_size - 1
        padded = torch.cat([(self.init_state(x) if state is None else state).to(x.dtype), x], dim=1)
        mixed = x * self.weight[:, 0]
        for back in range(1, self.kernel_size):
            earlier = padded[:, past - back:past - back + length]
            if position_ids is not None:
                earlier = earlier * (position_ids >= back)[..., None].to(x.dtype)
            mixed = mixed + earlier * self.weight[:, back]
        new_state = padded[:, length:].to(state_dtype(x))
        if position_ids is not None:  # the last document's inputs: zeros before its start
            from_end = torch.arange(past, 0, -1, device=x.device)  # how far back from the last token, plus 1
            inside = position_ids[:, -1:] >= from_end - 1
            new_state = new_state * inside[..., None].to(x.dtype)
        return F.silu(mixed), new_state

    def step(self, x: torch.Tensor, state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row, ``x`` ``[B, D]``; ``state`` is advanced in place (a fresh one when ``None``)."""
        if state is None:
            state = self.init_state(x)
        taps = torch.cat([state.to(x.dtype), x[:, None]], dim=1)  # oldest first
        mixed = x * self.weight[:, 0]  # summed in the sequence form's order: the same bits for one token
        for back in range(1, self.kernel_size):
            mixed = mixed + taps[:, -1 - back] * self.weight[:, back]
        state.copy_(taps[:, 1:])
        return F.silu(mixed), state
