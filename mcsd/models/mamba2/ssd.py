"""Mamba-2's mixer (Dao and Gu 2024, the SSD layer), as docs/architectures/mamba2.md reads it.

``z, xBC, dt_raw = in_proj(u)``; ``x, B, C = silu(conv(xBC))`` (a causal depthwise convolution
of ``conv_size`` taps over x, B and C together); per head h (``H = num_channels``, head width
``P = expand D / H``, B and C ``[N]`` shared over the heads): ``dt = softplus(dt_raw + dt_bias)``,
``A_h = -exp(A_log_h)``; ``S_t = exp(dt_t A) S_{t-1} + B_t^T (dt_t x_t)``, ``y_t = C_t S_t +
D_h x_t``; out ``= out_proj(RMSNorm(y * silu(z)))`` (the gated norm over the whole inner width,
gate first: Mamba-2's ``norm_before_gate=False``). That is ``decayed_attention(q = C, k = B,
v = dt x, log_decay = dt A)``, whose parallel, chunk and recurrent forms are SSD's.

Decoding state: ``[the SSD state [B, H, N, P] fp32, the convolution's last inputs]`` per layer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mcsd.models.mamba2.configuration_mamba2 import Mamba2Config
from mcsd.models.modules.conv import ShortConvolution
from mcsd.models.modules.decays import draw_dt_bias_
from mcsd.models.modules.layers import ChannelRMSNorm
from mcsd.models.modules.mixer import TokenMixer
from mcsd.ops.common import state_dtype
from mcsd.ops.context import ForwardContext
from mcsd.ops.decayed_attention import decayed_attention, decayed_attention_step
from mcsd.ops.flops import decayed_attention_flops


class Mamba2Mixer(TokenMixer):
    """Mamba-2's SSD layer. Initialisation: Normal(0, init_std) projections (the input projection
    nn.Linear's own U(+-1/sqrt(D)) with ``in_proj_init=uniform``, as the paper's code), the convolution as
    nn.Conv1d's, ``A`` uniform in [a_min, a_max] (``A_log = log A``), skip ``D = skip_init`` (1), dt's bias
    such that ``softplus(dt_bias)`` is log-uniform in [dt_min, dt_max], unit norm gains;
    ``out_proj`` is scaled by the skeleton."""

    separates_documents = True  # -inf log-decay at each start (the op), the convolution from it

    def __init__(self, config: Mamba2Config) -> None:
        super().__init__()
        self.num_heads = config.num_channels
        self.inner_width = config.expand * config.hidden_size
        self.head_width = self.inner_width // self.num_heads
        self.state_size = config.state_size
        self.init_std = config.init_std
        self.in_proj_init, self.skip_init = config.in_proj_init, config.skip_init
        self.dt_range, self.a_range = (config.dt_min, config.dt_max), (config.a_min, config.a_max)
        self.conv_width = self.inner_width + 2 * self.state_size  # x, B, C
        self.in_proj = nn.Linear(config.hidden_size, self.inner_width + self.conv_width + self.num_heads, bias=False)
        self.conv = ShortConvolution(self.conv_width, config.conv_size)
        self.dt_bias = nn.Parameter(torch.empty(self.num_heads))
        self.A_log = nn.Parameter(torch.empty(self.num_heads))
        self.skip = nn.Parameter(torch.empty(self.num_heads))
        self.norm = ChannelRMSNorm(1, self.inner_width, config.norm_eps)
        self.out_proj = nn.Linear(self.inner_width, config.hidden_size, bias=False)

    def reset_parameters(self) -> None:
        if self.in_proj_init == "uniform":
            bound = 1 / math.sqrt(self.in_proj.in_features)
            nn.init.uniform_(self.in_proj.weight, -bound, bound)
        else:
            nn.init.normal_(self.in_proj.weight, std=self.init_std)
        nn.init.normal_(self.out_proj.weight, std=self.init_std)
        self.conv.reset_parameters()
        with torch.no_grad():
            self.A_log.copy_(torch.log(torch.empty(self.num_heads).uniform_(*self.a_range)))
        draw_dt_bias_(self.dt_bias, *self.dt_range)
        nn.init.constant_(self.skip, self.skip_init)
        self.norm.reset_parameters()

    def residual_weights(self) -> list[nn.Parameter]:
        return [self.out_proj.weight]

    def split(self, projected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The input projection ``[..., *]`` -> the gate z, the convolution's input xBC, dt's logits."""
        return projected.split((self.inner_width, self.conv_width, self.num_heads), dim=-1)

    def ssd_inputs(self, convolved: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The convolution's output ``[..., xBC]`` and dt's logits ``[..., H]`` -> x ``[..., H, P]``,
        B and C ``[..., N]``, dt ``[..., H]`` and its log-decay ``dt A`` (both fp32)."""
        inner, keys, queries = convolved.split((self.inner_width, self.state_size, self.state_size), dim=-1)
        accumulate = state_dtype(dt)
        dt = F.softplus(dt.to(accumulate) + self.dt_bias.to(accumulate))
        log_decay = dt * -torch.exp(self.A_log.to(accumulate))
        return inner.unflatten(-1, (self.num_heads, self.head_width)), keys, queries, dt, log_decay

    def output(self, mixed: torch.Tensor, inner: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """``y + D x`` ``[..., H, P]``, gated by ``silu(z)`` then normalised over the inner width."""
        mixed = (mixed + self.skip[:, None].to(inner.dtype) * inner).flatten(-2)
        return self.out_proj(self.norm((mixed * F.silu(gate))[..., None, :])[..., 0, :])

    def forward(
        self, x: torch.Tensor, state: list | None, position: int, context: ForwardContext,
    ) -> tuple[torch.Tensor, list]:
        ssd_state, conv_state = (None, None) if state is None else state
        gate, conv_input, dt = self.split(self.in_proj(x))
        convolved, conv_state = self.conv(conv_input, conv_state, context.position_ids)
        inner, keys, queries, dt, log_decay = self.ssd_inputs(convolved, dt)  # [B, N, H, P], [B, N, S], [B, N, H]
        heads = (-1, self.num_heads, -1, -1)
        values = (inner * dt[..., None].to(inner.dtype)).transpose(1, 2)  # [B, H, N, P]
        mixed, ssd_state = decayed_attention(queries[:, None].expand(heads), keys[:, None].expand(heads), values,
                                             log_decay.transpose(1, 2), ssd_state, context)
        return self.output(mixed.transpose(1, 2), inner, gate), [ssd_state, conv_state]

    def step(
        self, x: torch.Tensor, state: list | None, position: int | torch.Tensor, context: ForwardContext,
    ) -> tuple[torch.Tensor, list]:
        """One token per row, ``x`` ``[B, D]``: the recurrent form's numbers without its sequence axis."""
        ssd_state, conv_state = (None, None) if state is None else state
        gate, conv_input, dt = self.split(self.in_proj(x))
        convolved, conv_state = self.conv.step(conv_input, conv_state)
        inner, keys, queries, dt, log_decay = self.ssd_inputs(convolved, dt)  # [B, H, P], [B, S], [B, H]
        if ssd_state is None:
            ssd_state = x.new_zeros(x.shape[0], self.num_heads, self.state_size, self.head_width, dtype=dt.dtype)
        heads = (-1, self.num_heads, -1)
        mixed, ssd_state = decayed_attention_step(queries[:, None].expand(heads), keys[:, None].expand(heads),
                                                  inner * dt[..., None].to(inner.dtype), log_decay, ssd_state, context)
        return self.output(mixed, inner, gate), [ssd_state, conv_state]

    def sequence_flops(self, length: int, context: ForwardContext) -> int:
        """Decayed attention per head: the shared ``B`` and ``C`` (``state_size``) as keys and
        queries, the head's ``P`` features as values; the skip term is elementwise."""
        return self.num_heads * decayed_attention_flops(length, self.state_size, self.head_width, context.form,
                                                        context.chunk_size)
