"""Multi-scale retention (RetNet, Sun et al. 2023), as docs/architectures/retnet.md reads it.

Per head h (``H = num_channels``, key width ``dk = D / H``, value width ``dv =
value_expansion * dk``): ``Q = X W_Q``, ``K = X W_K / sqrt(dk)``, both rotated at absolute
positions (RoPE), ``V = X W_V``, ``G = X W_G``; retention including the current token,
``o_n = sum_{m<=n} gamma_h^(n-m) (q_n . k_m) v_m`` with the fixed decay ``gamma_h = 1 -
2^(-5-h)`` (MCSD's alpha, the same fp32 log-decay); output ``W_O(swish(G) *
RMSNorm_per_head(o))`` with a gain per feature. None of torchscale's extra normalisations
(decay-matrix row sums, clamped score row sums, the recurrent form's sqrt scaling): without
them the three forms agree before the norm, not only after it.

Decoding state: ``[B, H, dk, dv]`` fp32 per layer, whatever the length.

Its parts are switches (settings of :class:`RetNetConfig`, for the study of what it needs to
recall): ``rope``, ``retention_norm``, ``output_gate``, ``decay_offset`` and ``short_conv`` (a
:class:`~mcsd.models.modules.conv.ShortConvolution` on the input; the state is then
``[retention state, the convolution's last inputs]``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mcsd.models.modules.conv import ShortConvolution
from mcsd.models.modules.decays import section_log_decay
from mcsd.models.modules.layers import ChannelRMSNorm
from mcsd.models.modules.mixer import TokenMixer
from mcsd.models.modules.rotary import rotary, rotary_step
from mcsd.models.retnet.configuration_retnet import RetNetConfig
from mcsd.ops.context import ForwardContext
from mcsd.ops.common import state_dtype
from mcsd.ops.decayed_attention import decayed_attention, decayed_attention_step
from mcsd.ops.flops import decayed_attention_flops


class MultiScaleRetention(TokenMixer):
    """RetNet's mixer. Initialisation: Normal(0, init_std) projections, unit norm gains;
    ``out_proj`` writes into the residual stream (the skeleton scales it to init_std / sqrt(2 L))."""

    def __init__(self, config: RetNetConfig) -> None:
        super().__init__()
        self.num_heads = config.num_channels
        self.key_width = config.channel_width
        self.value_width = config.value_expansion * config.channel_width
        self.rope_base = config.rope_base if config.rope else None
        self.decay_offset = config.decay_offset
        self.gated = config.output_gate
        self.init_std = config.init_std
        value_total = self.num_heads * self.value_width
        self.short_conv = ShortConvolution(config.hidden_size, config.short_conv) if config.short_conv else None
        self.qk_proj = nn.Linear(config.hidden_size, 2 * config.hidden_size, bias=False)
        self.vg_proj = nn.Linear(config.hidden_size, (2 if self.gated else 1) * value_total, bias=False)
        self.norm = ChannelRMSNorm(self.num_heads, self.value_width, config.norm_eps) if config.retention_norm else None
        self.out_proj = nn.Linear(value_total, config.hidden_size, bias=False)

    def reset_parameters(self) -> None:
        for projection in (self.qk_proj, self.vg_proj, self.out_proj):
            nn.init.normal_(projection.weight, std=self.init_std)
        for part in (self.norm, self.short_conv):
            if part is not None:
                part.reset_parameters()

    def log_decay(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """``log(1 - 2^(-decay_offset-h))`` per head, ``[H]`` (fp32, or fp64 in an fp64 model)."""
        return section_log_decay("decay", self.num_heads, device, dtype, self.decay_offset)

    def output(self, retained: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """``swish(G) * RMSNorm_per_head(o)``, ``[..., H, dv]``, less the parts switched off."""
        mixed = self.norm(retained) if self.norm is not None else retained
        return mixed * F.silu(gate) if gate is not None else mixed

    def split_value_gate(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``x`` ``[..., D]`` -> value and gate ``[..., H, dv]`` each (no gate with ``output_gate: false``)."""
        parts = self.vg_proj(x).view(*x.shape[:-1], 2 if self.gated else 1, self.num_heads, self.value_width)
        return parts[..., 0, :, :], parts[..., 1, :, :] if self.gated else None

    def residual_weights(self) -> list[nn.Parameter]:
        return [self.out_proj.weight]

    separates_documents = True  # -inf log-decay at each start, rotary from it

    def forward(
        self, x: torch.Tensor, state: torch.Tensor | None, position: int, context: ForwardContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, length, _ = x.shape
        state, conv_state = self.split_state(state)
        position_ids = context.position_ids
        if self.short_conv is not None:
            x, conv_state = self.short_conv(x, conv_state, position_ids)
        query, key = self.qk_proj(x).view(batch, length, 2, self.num_heads, self.key_width).permute(2, 0, 3, 1, 4)
        value, gate = self.split_value_gate(x)
        positions = position if position_ids is None else position_ids
        if self.rope_base is not None:
            query, key = rotary(query, positions, self.rope_base), rotary(key, positions, self.rope_base)
        key = key / math.sqrt(self.key_width)
        value = value.transpose(1, 2)
        log_decay = self.log_decay(x.device, state_dtype(value))
        retained, state = decayed_attention(query, key, value, log_decay, state, context)
        mixed = self.output(retained.transpose(1, 2), gate)  # [B, N, H, dv]
        return self.out_proj(mixed.reshape(batch, length, -1)), self.join_state(state, conv_state)

    def split_state(self, state: torch.Tensor | list | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(the retention state, the convolution's) of a layer state; ``None`` for each at the start."""
        if self.short_conv is None or state is None:
            return state, None
        return state[0], state[1]

    def join_state(self, state: torch.Tensor, conv_state: torch.Tensor | None) -> torch.Tensor | list[torch.Tensor]:
        return state if self.short_conv is None else [state, conv_state]

    def sequence_flops(self, length: int, context: ForwardContext) -> int:
        return self.num_heads * decayed_attention_flops(length, self.key_width, self.value_width, context.form,
                                                        context.chunk_size)

    def step(
        self, x: torch.Tensor, state: torch.Tensor | None, position: int | torch.Tensor, context: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row, ``x`` ``[B, D]``: the recurrent form's numbers without its sequence axis."""
        batch, _ = x.shape
        state, conv_state = self.split_state(state)
        if self.short_conv is not None:
            x, conv_state = self.short_conv.step(x, conv_state)
        query_key = self.qk_proj(x).view(batch, 2, self.num_heads, self.key_width)
        if self.rope_base is not None:
            query_key = rotary_step(query_key, position, self.rope_base)
        query, key = query_key.unbind(1)
        value, gate = self.split_value_gate(x)
        if state is None:
            state = x.new_zeros(batch, self.num_heads, self.key_width, self.value_width, dtype=state_dtype(value))
        log_decay = self.log_decay(x.device, state_dtype(value))[None, :].expand(batch, -1)
        retained, state = decayed_attention_step(query, key / math.sqrt(self.key_width), value, log_decay, state,
                                                 context)
        mixed = self.output(retained, gate)  # [B, H, dv]
        return self.out_proj(mixed.reshape(batch, -1)), self.join_state(state, conv_state)
