"""Gated linear attention (GLA, Yang et al. 2024), as docs/architectures/gla.md reads it.

Per head h (``H = num_channels``, key width ``dk``, value width ``dv``): ``q = x W_q / sqrt(dk)``,
``k = x W_k``, ``v = x W_v``, an output gate ``r = x W_r``, and a log-decay per key channel
``g = logsigmoid(x W_1 W_2 + b) / 16`` (a rank-16 gate, as the paper and fla's layer); then
``S_n = diag(exp(g_n)) S_{n-1} + k_n^T v_n``, ``o_n = q_n S_n`` (:mod:`mcsd.ops.gla`, the current
token included), and the output ``W_o(swish(r) * RMSNorm_per_head(o))`` with a gain per feature.
No feature map on q and k (the paper's choice, fla's default).

Decoding state: ``[B, H, dk, dv]`` fp32 per layer, whatever the length (with ``short_conv``,
``[that state, the convolution's last inputs]``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mcsd.models.gla.configuration_gla import GLAConfig
from mcsd.models.modules.conv import ShortConvolution
from mcsd.models.modules.layers import ChannelRMSNorm
from mcsd.models.modules.mixer import TokenMixer
from mcsd.ops.common import state_dtype
from mcsd.ops.context import ForwardContext
from mcsd.ops.flops import gla_flops
from mcsd.ops.gla import gla, gla_step


class GatedLinearAttention(TokenMixer):
    """GLA's mixer. Initialisation: Normal(0, init_std) projections (the gate's two factors
    too), a zero gate bias (every decay ``sigmoid(0)^(1/16) = 0.958`` at the start), unit norm
    gains; ``out_proj`` writes into the residual stream (the skeleton scales it)."""

    separates_documents = True  # -inf log-decay at each start (the op), the convolution from it

    def __init__(self, config: GLAConfig) -> None:
        super().__init__()
        self.num_heads, self.key_width, self.value_width = config.num_channels, config.key_width, config.value_width
        self.gate_normalizer = config.gate_normalizer
        self.init_std = config.init_std
        keys, values = self.num_heads * self.key_width, self.num_heads * self.value_width
        self.short_conv = ShortConvolution(config.hidden_size, config.short_conv) if config.short_conv else None
        self.qk_proj = nn.Linear(config.hidden_size, 2 * keys, bias=False)
        self.vr_proj = nn.Linear(config.hidden_size, 2 * values, bias=False)  # values and the output gate
        self.gate_down = nn.Linear(config.hidden_size, config.gate_rank, bias=False)
        self.gate_up = nn.Linear(config.gate_rank, keys, bias=True)
        self.norm = ChannelRMSNorm(self.num_heads, self.value_width, config.norm_eps)
        self.out_proj = nn.Linear(values, config.hidden_size, bias=False)

    def reset_parameters(self) -> None:
        for projection in (self.qk_proj, self.vr_proj, self.gate_down, self.gate_up, self.out_proj):
            nn.init.normal_(projection.weight, std=self.init_std)
        nn.init.zeros_(self.gate_up.bias)
        self.norm.reset_parameters()
        if self.short_conv is not None:
            self.short_conv.reset_parameters()

    def residual_weights(self) -> list[nn.Parameter]:
        return [self.out_proj.weight]

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``x`` ``[..., D]`` -> q (scaled), k, log-decay ``[..., H, dk]`` (the decay's in fp32)
        and v, the output gate ``[..., H, dv]``."""
        heads = x.shape[:-1]
        query, key = self.qk_proj(x).view(*heads, 2, self.num_heads, self.key_width).unbind(-3)
        value, gate = self.vr_proj(x).view(*heads, 2, self.num_heads, self.value_width).unbind(-3)
        logits = self.gate_up(self.gate_down(x)).view(*heads, self.num_heads, self.key_width)
        log_decay = F.logsigmoid(logits.to(state_dtype(logits))) / self.gate_normalizer
        return query / math.sqrt(self.key_width), key, log_decay, value, gate

    def output(self, mixed: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """``swish(r) * RMSNorm_per_head(o)`` flattened over the heads, through ``W_o``."""
        gated = self.norm(mixed) * F.silu(gate)
        return self.out_proj(gated.reshape(*gated.shape[:-2], -1))

    def forward(
        self, x: torch.Tensor, state: torch.Tensor | list | None, position: int, context: ForwardContext,
    ) -> tuple[torch.Tensor, torch.Tensor | list]:
        state, conv_state = self.split_state(state)
        if self.short_conv is not None:
            x, conv_state = self.short_conv(x, conv_state, context.position_ids)
        query, key, log_decay, value, gate = (part.transpose(1, 2) for part in self.projections(x))  # [B, H, N, .]
        mixed, state = gla(query, key, value, log_decay, state, context)
        return self.output(mixed.transpose(1, 2), gate.transpose(1, 2)), self.join_state(state, conv_state)

    def step(
        self, x: torch.Tensor, state: torch.Tensor | list | None, position: int | torch.Tensor,
        context: ForwardContext,
    ) -> tuple[torch.Tensor, torch.Tensor | list]:
        """One token per row, ``x`` ``[B, D]``: the recurrent form's numbers without its sequence axis."""
        state, conv_state = self.split_state(state)
        if self.short_conv is not None:
            x, conv_state = self.short_conv.step(x, conv_state)
        query, key, log_decay, value, gate = self.projections(x)  # [B, H, .]
        if state is None:
            state = x.new_zeros(x.shape[0], self.num_heads, self.key_width, self.value_width, dtype=state_dtype(value))
        mixed, state = gla_step(query, key, value, log_decay, state, context)
        return self.output(mixed, gate), self.join_state(state, conv_state)

    def split_state(self, state: torch.Tensor | list | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(the attention state, the convolution's) of a layer state; ``None`` for each at the start."""
        if self.short_conv is None or state is None:
            return state, None
        return state[0], state[1]

    def join_state(self, state: torch.Tensor, conv_state: torch.Tensor | None) -> torch.Tensor | list[torch.Tensor]:
        return state if self.short_conv is None else [state, conv_state]

    def sequence_flops(self, length: int, context: ForwardContext) -> int:
        return self.num_heads * gla_flops(length, self.key_width, self.value_width, context.form, context.chunk_size)
