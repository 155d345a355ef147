"""Gated DeltaNet's mixer (Yang, Kautz and Hatamizadeh 2025), as docs/architectures/gated_deltanet.md reads it.

``q, k, v = silu(conv(x W_qkv))`` (a causal depthwise convolution of ``conv_size`` taps over the
three); per head h (``H = num_channels``, key width ``dk`` = the head width, value width
``dv``): q and k L2-normalised (``x / sqrt(|x|^2 + 1e-6)``, as fla's kernels), q scaled by
``1 / sqrt(dk)``, ``beta = sigmoid(x w_beta)``, and the log-decay ``g = -A softplus(x w_a +
dt_bias)`` (Mamba-2's gate; 0 for DeltaNet, ``gated=false``); then the gated delta rule
``S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = q_t S_t``
(:mod:`mcsd.ops.delta_rule`), and the output ``W_o(RMSNorm_per_head(o) * silu(x W_g))``.

Decoding state: ``[the delta rule's state [B, H, dk, dv] fp32, the convolution's last inputs]``
per layer, whatever the length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mcsd.models.gated_deltanet.configuration_gated_deltanet import GatedDeltaNetConfig
from mcsd.models.modules.conv import ShortConvolution
from mcsd.models.modules.decays import draw_dt_bias_
from mcsd.models.modules.layers import ChannelRMSNorm
from mcsd.models.modules.mixer import TokenMixer
from mcsd.ops.common import state_dtype
from mcsd.ops.context import ForwardContext
from mcsd.ops.delta_rule import delta_rule, delta_rule_step
from mcsd.ops.flops import delta_rule_flops

L2_NORM_EPS = 1e-6  # fla's l2norm: x / sqrt(sum x^2 + eps)


class GatedDeltaNetMixer(TokenMixer):
    """Gated DeltaNet's mixer. Initialisation: Normal(0, init_std) projections, the convolution
    as nn.Conv1d's, ``A`` uniform in [a_min, a_max] (``A_log = log A``), dt's bias such that
    ``softplus(dt_bias)`` is log-uniform in [dt_min, dt_max], unit norm gains; ``out_proj`` is
    scaled by the skeleton."""

    separates_documents = True  # -inf log-decay at each start (the op), the convolution from it

    def __init__(self, config: GatedDeltaNetConfig) -> None:
        super().__init__()
        self.num_heads, self.key_width, self.value_width = config.num_channels, config.channel_width, config.value_width
        self.gated = config.gated
        self.init_std = config.init_std
        self.dt_range, self.a_range = (config.dt_min, config.dt_max), (config.a_min, config.a_max)
        keys, values = self.num_heads * self.key_width, self.num_heads * self.value_width
        self.conv_widths = (keys, keys, values)  # q, k, v
        gates = self.num_heads * (2 if self.gated else 1)  # beta's logits (and the decay's)
        self.in_proj = nn.Linear(config.hidden_size, sum(self.conv_widths) + values + gates, bias=False)
        self.conv = ShortConvolution(sum(self.conv_widths), config.conv_size)
        if self.gated:
            self.dt_bias = nn.Parameter(torch.empty(self.num_heads))
            self.A_log = nn.Parameter(torch.empty(self.num_heads))
        self.norm = ChannelRMSNorm(self.num_heads, self.value_width, config.norm_eps)
        self.out_proj = nn.Linear(values, config.hidden_size, bias=False)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.in_proj.weight, std=self.init_std)
        nn.init.normal_(self.out_proj.weight, std=self.init_std)
        self.conv.reset_parameters()
        if self.gated:
            with torch.no_grad():
                self.A_log.copy_(torch.log(torch.empty(self.num_heads).uniform_(*self.a_range)))
            draw_dt_bias_(self.dt_bias, *self.dt_range)
        self.norm.reset_parameters()

    def residual_weights(self) -> list[nn.Parameter]:
        return [self.out_proj.weight]

    def split(self, projected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The input projection ``[..., *]`` -> the convolution's input (q, k, v), the output gate,
        the logits of beta (and of the decay) ``[..., H or 2H]``."""
        return projected.split((sum(self.conv_widths), self.num_heads * self.value_width, projected.shape[-1]
                                - sum(self.conv_widths) - self.num_heads * self.value_width), dim=-1)

    def rule_inputs(self, convolved: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The convolution's output ``[..., q k v]`` and the gates' logits -> q (normalised, scaled)
        and k ``[..., H, dk]`` (fp32), v ``[..., H, dv]``, beta and the log-decay ``[..., H]`` (fp32)."""
        query, key, value = (part.unflatten(-1, (self.num_heads, -1)) for part in convolved.split(self.conv_widths, -1))
        accumulate = state_dtype(value)
        query, key = (x.to(accumulate) * torch.rsqrt(x.to(accumulate).square().sum(-1, keepdim=True) + L2_NORM_EPS)
                      for x in (query, key))
        logits = logits.to(accumulate)
        beta = torch.sigmoid(logits[..., :self.num_heads])
        if self.gated:
            log_decay = -torch.exp(self.A_log.to(accumulate)) * F.softplus(logits[..., self.num_heads:]
                                                                           + self.dt_bias.to(accumulate))
        else:
            log_decay = torch.zeros_like(beta)
        return query / math.sqrt(self.key_width), key, value, beta, log_decay

    def output(self, mixed: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """``RMSNorm_per_head(o) * silu(gate)`` flattened over the heads, through ``W_o``."""
        gated = self.norm(mixed) * F.silu(gate.unflatten(-1, (self.num_heads, self.value_width)))
        return self.out_proj(gated.flatten(-2))

    def forward(
        self, x: torch.Tensor, state: list | None, position: int, context: ForwardContext,
    ) -> tuple[torch.Tensor, list]:
        rule_state, conv_state = (None, None) if state is None else state
        conv_input, gate, logits = self.split(self.in_proj(x))
        convolved, conv_state = self.conv(conv_input, conv_state, context.position_ids)
        parts = (part.transpose(1, 2) for part in self.rule_inputs(convolved, logits))  # [B, H, N, .]
        mixed, rule_state = delta_rule(*parts, rule_state, context)
        return self.output(mixed.transpose(1, 2), gate), [rule_state, conv_state]

    def step(
        self, x: torch.Tensor, state: list | None, position: int | torch.Tensor, context: ForwardContext,
    ) -> tuple[torch.Tensor, list]:
        """One token per row, ``x`` ``[B, D]``: the recurrent form's numbers without its sequence axis."""
        rule_state, conv_state = (None, None) if state is None else state
        conv_input, gate, logits = self.split(self.in_proj(x))
        convolved, conv_state = self.conv.step(conv_input, conv_state)
        query, key, value, beta, log_decay = self.rule_inputs(convolved, logits)  # [B, H, .]
        if rule_state is None:
            rule_state = x.new_zeros(x.shape[0], self.num_heads, self.key_width, self.value_width, dtype=beta.dtype)
        mixed, rule_state = delta_rule_step(query, key, value, beta, log_decay, rule_state, context)
        return self.output(mixed, gate), [rule_state, conv_state]

    def sequence_flops(self, length: int, context: ForwardContext) -> int:
        return self.num_heads * delta_rule_flops(length, self.key_width, self.value_width, context.form,
                                                 context.chunk_size)
