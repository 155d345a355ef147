"""State space duality (Mamba-2's SSD) as the Wonderful Matrices read it: no convolution,
RoPE on B and C at absolute positions instead, computed by the decayed linear-attention op.

Per head h (``H = num_channels``, head width ``P = ssd_expand * D / H``), state size N:
``z, x, B, C, dt_raw = in_proj(u)`` with B, C ``[N]`` shared over heads;
``dt = softplus(dt_raw + dt_bias)``, ``A_h = -exp(A_log_h)`` with ``A_log = log(1..H)``;
``S_t = exp(dt_t A) S_{t-1} + B_t^T (dt_t x_t)``, ``y_t = C_t S_t + skip_h x_t`` (skip from 1);
out ``= out_proj(RMSNorm_per_head(y) * silu(z))`` (Mamba-2's gated norm, per head as RetNet's;
``ssd_norm=gate_first``: stock Mamba-2's ``RMSNorm(y * silu(z))`` over the whole inner width).
That is ``decayed_attention(q = C, k = B, v = dt x, log_decay = dt A)``: its parallel, chunk
and recurrent forms are SSD's. Decoding state: ``[B, H, N, P]`` fp32 per layer.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from mcsd.models.modules.decays import draw_dt_bias_
from mcsd.models.modules.layers import ChannelRMSNorm
from mcsd.models.modules.mixer import TokenMixer
from mcsd.models.modules.rotary import rotary, rotary_step
from mcsd.models.wonderful_matrices.configuration_wonderful_matrices import WonderfulMatricesConfig
from mcsd.ops.context import ForwardContext
from mcsd.ops.common import state_dtype
from mcsd.ops.decayed_attention import decayed_attention, decayed_attention_step
from mcsd.ops.flops import decayed_attention_flops


class StateSpaceDuality(TokenMixer):
    """The hybrid's SSD mixer. Initialisation: Normal(0, init_std) projections, ``A_log =
    log(1..H)``, skip 1, unit norm gains, and dt's bias such that ``softplus(dt_bias)`` is
    log-uniform in [dt_min, dt_max] (Mamba-2's); ``out_proj`` is scaled by the skeleton."""

    def __init__(self, config: WonderfulMatricesConfig) -> None:
        super().__init__()
        self.num_heads = config.num_channels
        self.inner_width = config.ssd_expand * config.hidden_size
        self.head_width = self.inner_width // self.num_heads
        self.state_size = config.state_size
        self.rope_base = config.rope_base
        self.init_std = config.init_std
        self.dt_range = (config.dt_min, config.dt_max)
        widths = (self.inner_width, self.inner_width, self.state_size, self.state_size, self.num_heads)
        self.split_widths = widths
        self.in_proj = nn.Linear(config.hidden_size, sum(widths), bias=False)  # z, x, B, C, dt
        self.dt_bias = nn.Parameter(torch.empty(self.num_heads))
        self.A_log = nn.Parameter(torch.empty(self.num_heads))
        self.skip = nn.Parameter(torch.empty(self.num_heads))
        self.gate_first = config.ssd_norm == "gate_first"
        self.norm = (ChannelRMSNorm(1, self.inner_width, config.norm_eps) if self.gate_first
                     else ChannelRMSNorm(self.num_heads, self.head_width, config.norm_eps))
        self.out_proj = nn.Linear(self.inner_width, config.hidden_size, bias=False)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.in_proj.weight, std=self.init_std)
        nn.init.normal_(self.out_proj.weight, std=self.init_std)
        with torch.no_grad():
            self.A_log.copy_(torch.log(torch.arange(1, self.num_heads + 1, dtype=torch.float32)))
        draw_dt_bias_(self.dt_bias, *self.dt_range)
        nn.init.ones_(self.skip)
        self.norm.reset_parameters()

    def residual_weights(self) -> list[nn.Parameter]:
        return [self.out_proj.weight]

    separates_documents = True  # -inf log-decay at each start (the op), rotary from it

    def forward(
        self, x: torch.Tensor, state: torch.Tensor | None, position: int, context: ForwardContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, length, _ = x.shape
        gate, inner, keys, queries, dt = self.in_proj(x).split(self.split_widths, dim=-1)
        positions = position if context.position_ids is None else context.position_ids
        keys = rotary(keys[:, None], positions, self.rope_base).expand(-1, self.num_heads, -1, -1)  # B
        queries = rotary(queries[:, None], positions, self.rope_base).expand(-1, self.num_heads, -1, -1)  # C
        accumulate = state_dtype(dt)  # fp32 (fp64 for an fp64 model)
        dt = F.softplus(dt.to(accumulate) + self.dt_bias.to(accumulate)).transpose(1, 2)  # [B, H, N]
        log_decay = dt * -torch.exp(self.A_log.to(accumulate))[:, None]  # dt A
        inner = inner.view(batch, length, self.num_heads, self.head_width).transpose(1, 2)  # [B, H, N, P]
        values = inner * dt[..., None].to(inner.dtype)
        mixed, state = decayed_attention(queries, keys, values, log_decay, state, context)
        mixed = mixed + self.skip[:, None, None].to(inner.dtype) * inner
        gated = self.gated_norm(mixed.transpose(1, 2).reshape(batch, length, self.inner_width), gate)
        return self.out_proj(gated), state

    def sequence_flops(self, length: int, context: ForwardContext) -> int:
        """Decayed attention per head: the shared ``B`` and ``C`` (``state_size``) as keys and
        queries, the head's ``P`` features as values; the skip term is elementwise."""
        return self.num_heads * decayed_attention_flops(length, self.state_size, self.head_width, context.form,
                                                        context.chunk_size)

    def step(
        self, x: torch.Tensor, state: torch.Tensor | None, position: int | torch.Tensor, context: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row, ``x`` ``[B, D]``: the recurrent form's numbers without its sequence axis."""
        batch, _ = x.shape
        gate, inner, keys, queries, dt = self.in_proj(x).split(self.split_widths, dim=-1)
        keys = rotary_step(keys[:, None], position, self.rope_base).expand(-1, self.num_heads, -1)  # B
        queries = rotary_step(queries[:, None], position, self.rope_base).expand(-1, self.num_heads, -1)  # C
        accumulate = state_dtype(dt)
        dt = F.softplus(dt.to(accumulate) + self.dt_bias.to(accumulate))  # [B, H]
        log_decay = dt * -torch.exp(self.A_log.to(accumulate))
        inner = inner.view(batch, self.num_heads, self.head_width)  # [B, H, P]
        if state is None:
            state = x.new_zeros(batch, self.num_heads, self.state_size, self.head_width, dtype=accumulate)
        mixed, state = decayed_attention_step(queries, keys, inner * dt[..., None].to(inner.dtype), log_decay, state,
                                              context)
        mixed = mixed + self.skip[:, None].to(inner.dtype) * inner
        return self.out_proj(self.gated_norm(mixed.reshape(batch, self.inner_width), gate)), state

    def gated_norm(self, mixed: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """``[..., inner]`` -> ``[..., inner]``: each head normalised then gated (``per_head``), or
        gated then normalised over the whole width (``gate_first``)."""
        if self.gate_first:
            return self.norm((mixed * F.silu(gate))[..., None, :])[..., 0, :]
        heads = (*mixed.shape[:-1], self.num_heads, self.head_width)
        return (self.norm(mixed.view(heads)) * F.silu(gate.view(heads))).flatten(-2)
