"""RWKV-4's time mix and channel mix, each with its token shift (the previous token's
normed input, carried in the decoding state), and RWKV-4's initialisation of the decay,
bonus and mixing coefficients (which depend on the layer's depth)."""

from __future__ import annotations

import math

import torch
from torch import nn

from mcsd.models.modules.mixer import TokenMixer
from mcsd.models.rwkv4.configuration_rwkv4 import RWKV4Config
from mcsd.models.rwkv4.perspectives import PerspectiveMixes, mix
from mcsd.ops.context import ForwardContext
from mcsd.ops.common import state_dtype
from mcsd.ops.flops import wkv_flops
from mcsd.ops.wkv import empty_wkv_state, wkv, wkv_step


def depth_ratios(layer_index: int, num_layers: int) -> tuple[float, float]:
    """RWKV-4's ``ratio_0_to_1 = l / (L - 1)`` (0 when L = 1) and ``ratio_1_to_almost0 = 1 - l / L``."""
    return (layer_index / (num_layers - 1) if num_layers > 1 else 0.0), 1.0 - layer_index / num_layers


def token_shift(x: torch.Tensor, last: torch.Tensor | None, starts: torch.Tensor | None = None) -> torch.Tensor:
    """``x_{t-1}`` for every position of ``x [B, N, D]``: ``last`` (the token before the
    chunk, zeros at the start of a sequence) then ``x`` without its last token; zeros at each
    document's start too, given ``starts`` ``[B, N]`` (documents apart: a context's)."""
    first = torch.zeros_like(x[:, :1]) if last is None else last[:, None].to(x.dtype)
    # The first row, then x without its last: cut after the concatenation, so that no slice of
    # N - 1 rows is made (torch.export would guard N != 2, and an ONNX prefill miss prompts of two).
    shifted = torch.cat([first, x], dim=1).narrow(1, 0, x.shape[1])
    return shifted if starts is None else shifted.masked_fill(starts[..., None], 0.0)


def mixing_coefficients(perspectives: int, width: int, count: int) -> list[nn.Parameter]:
    """``count`` token-shift mixes of shape ``[perspectives, width]``, kept out of weight decay."""
    mixes = [nn.Parameter(torch.empty(perspectives, width)) for _ in range(count)]
    for param in mixes:
        param._no_weight_decay = True
    return mixes


class TimeMix(PerspectiveMixes, TokenMixer):
    """``W_o(sigmoid(r) * wkv(w, u, k, v))`` with ``r, k, v = W_{r,k,v}(mu x + (1 - mu) x_{t-1})``,
    ``w = exp(time_decay)``, ``u = time_first``; state ``(last x [B, D], wkv state [B, 3, D])``.
    The mixes mu have one row per perspective (the batch then holds the P streams)."""

    def __init__(self, config: RWKV4Config, layer_index: int) -> None:
        super().__init__()
        width = config.hidden_size
        self.layer_index, self.num_layers = layer_index, config.num_layers
        self.init_std = config.init_std
        self.time_decay = nn.Parameter(torch.empty(width))
        self.time_first = nn.Parameter(torch.empty(width))
        self.mix_k, self.mix_v, self.mix_r = mixing_coefficients(config.perspectives, width, 3)
        self.key, self.value, self.receptance, self.output = (nn.Linear(width, width, bias=False) for _ in range(4))

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """RWKV-4's: time_decay_c = -5 + 8 (c/(D-1))^(0.7 + 1.3 r01); time_first_c = ln 0.3 +
        0.5 ((c+1) mod 3 - 1); mu_k = (c/D)^r10, mu_v = mu_k + 0.3 r01, mu_r = (c/D)^(0.5 r10)."""
        width = self.time_decay.numel()
        ratio_0_to_1, ratio_1_to_almost0 = depth_ratios(self.layer_index, self.num_layers)
        channel = torch.arange(width, dtype=torch.float64)
        self.time_decay.copy_(-5 + 8 * (channel / max(width - 1, 1)) ** (0.7 + 1.3 * ratio_0_to_1))
        self.time_first.copy_(math.log(0.3) + 0.5 * ((channel + 1) % 3 - 1))
        fraction = channel / width
        self.mix_k.copy_(fraction ** ratio_1_to_almost0)
        self.mix_v.copy_(fraction ** ratio_1_to_almost0 + 0.3 * ratio_0_to_1)
        self.mix_r.copy_(fraction ** (0.5 * ratio_1_to_almost0))
        for linear in (self.key, self.value, self.receptance, self.output):
            nn.init.normal_(linear.weight, std=self.init_std)

    def residual_weights(self) -> list[nn.Parameter]:
        return [self.output.weight]

    sequence_products = False  # the WKV's sums are elementwise (log-space weights times values)

    def sequence_flops(self, length: int, context: ForwardContext) -> int:
        """The WKV over every channel; the token shift's blend of two neighbours is elementwise."""
        return wkv_flops(length, self.time_decay.numel(), context.form, context.chunk_size)

    separates_documents = True  # the token shift and the WKV restart at each document

    def forward(self, x: torch.Tensor, state, position: int, context: ForwardContext):
        last, wkv_state = state if state is not None else (None, None)
        shifted = token_shift(x, last, context.starts)
        k = self.key(mix(shifted, x, self.mix_k))
        v = self.value(mix(shifted, x, self.mix_v))
        r = self.receptance(mix(shifted, x, self.mix_r))
        mixed, wkv_state = wkv(torch.exp(self.time_decay), self.time_first, k, v, wkv_state, context)
        return self.output(torch.sigmoid(r) * mixed), (x[:, -1].to(state_dtype(x)), wkv_state)

    def step(self, x: torch.Tensor, state, position: int | torch.Tensor, context: ForwardContext):
        """One token per row, ``x`` ``[B, D]``: the recurrent form's numbers without its sequence axis."""
        last, wkv_state = state if state is not None else (None, None)
        shifted = torch.zeros_like(x) if last is None else last.to(x.dtype)
        k = self.key(mix(shifted, x, self.mix_k))
        v = self.value(mix(shifted, x, self.mix_v))
        r = self.receptance(mix(shifted, x, self.mix_r))
        if wkv_state is None:
            wkv_state = empty_wkv_state(x.shape[0], x.shape[1], x.device, state_dtype(v))
        mixed, wkv_state = wkv_step(torch.exp(self.time_decay), self.time_first, k, v, wkv_state, context)
        return self.output(torch.sigmoid(r) * mixed), (x.to(state_dtype(x)), wkv_state)


class ChannelMix(PerspectiveMixes, TokenMixer):
    """RWKV's MLP: ``sigmoid(W_r x~_r) * W_v relu(W_k x~_k)^2`` with ``x~ = mu x + (1 - mu) x_{t-1}``
    (its own token shift); width ``mlp_hidden_size``; state: the last x."""

    def __init__(self, config: RWKV4Config, layer_index: int) -> None:
        super().__init__()
        width = config.hidden_size
        self.layer_index, self.num_layers, self.init_std = layer_index, config.num_layers, config.init_std
        self.mix_k, self.mix_r = mixing_coefficients(config.perspectives, width, 2)
        self.key = nn.Linear(width, config.mlp_hidden_size, bias=False)
        self.receptance = nn.Linear(width, width, bias=False)
        self.value = nn.Linear(config.mlp_hidden_size, width, bias=False)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """RWKV-4's: mu_k = mu_r = (c/D)^r10."""
        width = self.mix_k.shape[-1]
        _, ratio_1_to_almost0 = depth_ratios(self.layer_index, self.num_layers)
        fraction = torch.arange(width, dtype=torch.float64) / width
        self.mix_k.copy_(fraction ** ratio_1_to_almost0)
        self.mix_r.copy_(fraction ** ratio_1_to_almost0)
        for linear in (self.key, self.receptance, self.value):
            nn.init.normal_(linear.weight, std=self.init_std)

    def residual_weights(self) -> list[nn.Parameter]:
        return [self.value.weight]

    def sequence_flops(self, length: int, context: ForwardContext) -> int:
        """None: an MLP whose only tie between positions is the token shift (elementwise)."""
        return 0

    separates_documents = True  # its token shift restarts at each document

    def forward(self, x: torch.Tensor, state, position: int, context: ForwardContext):
        shifted = token_shift(x, state, context.starts)
        k = torch.relu(self.key(mix(shifted, x, self.mix_k))).square()
        r = torch.sigmoid(self.receptance(mix(shifted, x, self.mix_r)))
        return r * self.value(k), x[:, -1].to(state_dtype(x))

    def step(self, x: torch.Tensor, state, position: int | torch.Tensor, context: ForwardContext):
        """One token per row, ``x`` ``[B, D]``."""
        shifted = torch.zeros_like(x) if state is None else state.to(x.dtype)
        k = torch.relu(self.key(mix(shifted, x, self.mix_k))).square()
        r = torch.sigmoid(self.receptance(mix(shifted, x, self.mix_r)))
        return r * self.value(k), x.to(state_dtype(x))
