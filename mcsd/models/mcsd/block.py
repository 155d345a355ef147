"""The MCSD model (Section 2): slope and decay sections fused in the MCSD block.

Shapes: the block's input ``[B, N, D]`` is split into C channels of width Dc. Each
section projects it per channel (grouped weights, Eqs. 1 and 7) into a history branch
and a current branch:

- slope (Eqs. 1-6): ``V' = W_s V`` with the softmax-normalised slope matrix of Eq. 3
  (row n >= 1 averages tokens ``j < n`` with weights ``exp(-(n-j) beta_i)``; row 0 is
  token 0 itself), ``Theta_s = SiLU(V') * U``;
- decay (Eqs. 7-12): ``E' = RMSNorm(W_d E)`` with ``W_d[n, j] = alpha_i^(n-j)`` for
  ``j < n`` (row 0: token 0 itself), RMSNorm over each channel's Dc features (the paper's
  epsilon; Eq. 20 applies it to the decay state), ``Theta_d = E' * sigmoid(F)``. The
  RMSNorm's initial gain (``decay_norm_gain_init``) and the normalisation itself
  (``decay_norm: rmsnorm | sum``) are settings: the paper specifies neither.

Both history branches are the exponential filter of :mod:`mcsd.ops.exp_filter` with a
fixed per-channel decay (``exp(-beta_i)`` resp. ``alpha_i``), read at absolute positions by
:mod:`mcsd.ops.exp_filter.history` in every form (the slope's softmax denominator is a known
function of the position); the block keeps the projections, the gates and the norm. Sections are fused by
per-channel concatenation and the output projection (Eq. 13) or by summation (Eq. 20).

Decoding state per section: ``[B, C, Dc]`` fp32. The slope keeps the normalised average
``V'`` of the tokens seen (the convex update of Eq. 16); the decay keeps the unnormalised
sum ``sum_j alpha^(n-j) E_j`` (Eq. 19).

Two switches of the configuration change the block beyond the paper (issue 90):

- ``short_conv``: a :class:`~mcsd.models.modules.conv.ShortConvolution` on the block's input
  before the projections; its state (the last inputs, ``[B, K-1, D]`` in the model's dtype)
  follows the sections' in the layer's state.
- ``input_decay``: each decay section's coefficient is the token's, ``alpha_{n,i} =
  sigmoid(w_i . x_n + b_i)`` (the logits in fp32), so its history is ``sum_{j<n} (prod_{j<r<=n}
  alpha_r) E_j``: decayed linear attention (:mod:`mcsd.ops.decayed_attention`) with one key
  feature, ``q = k = 1``, read one token late (``alpha_n`` times the sum up to ``n-1``; row 0
  the token itself, as the fixed section's). Its state is that sum up to the last token,
  ``[B, C, Dc]`` fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mcsd.models.mcsd.configuration_mcsd import MCSDConfig
from mcsd.models.modules.conv import ShortConvolution
from mcsd.models.modules.decays import decay_rates, log_decay_values, section_log_decay
from mcsd.models.modules.layers import ChannelRMSNorm, GroupedLinear
from mcsd.models.modules.mixer import TokenMixer
from mcsd.ops.context import STEP, ForwardContext
from mcsd.ops.decayed_attention import decayed_attention, decayed_attention_step
from mcsd.ops.exp_filter import History, exp_filter_matrix, filter_histories, history_step, history_weight_sum
from mcsd.ops.flops import decayed_attention_flops, exp_filter_flops


def slope_matrix(length: int, num_channels: int) -> torch.Tensor:
    """``W_s`` of Eqs. 3-4, ``[C, N, N]``: the matrix the slope section applies to V."""
    log_decay = section_log_decay("slope", num_channels, torch.device("cpu"))
    matrix = exp_filter_matrix(log_decay, length)
    matrix = matrix / history_weight_sum(log_decay, torch.arange(length))[:, :, None]
    matrix[:, 0, 0] = 1.0
    return matrix


def decay_matrix(length: int, num_channels: int, decay_norm: str = "rmsnorm") -> torch.Tensor:
    """``W_d`` of Eqs. 9-10 before the RMSNorm, ``[C, N, N]``; with ``decay_norm="sum"`` each
    row divided by its sum (the weighted average that replaces the RMSNorm)."""
    log_decay = section_log_decay("decay", num_channels, torch.device("cpu"))
    matrix = exp_filter_matrix(log_decay, length)
    if decay_norm == "sum":
        matrix = matrix / history_weight_sum(log_decay, torch.arange(length))[:, :, None]
    matrix[:, 0, 0] = 1.0
    return matrix


class Section(torch.nn.Module):
    """One slope or decay section: its history (how the exponential filter is read, a
    :class:`~mcsd.ops.exp_filter.History`) and the gate that makes ``Theta`` ``[B, N, C, Dc]`` of
    it (:meth:`gate`). Its projections are the block's (one grouped projection for every section),
    and the block filters every section's history together."""

    def __init__(self, kind: str, config: MCSDConfig) -> None:
        super().__init__()
        self.kind = kind
        # input_decay: the decay's logit per channel from the block's input (GLA's gate).
        self.decay_gate = (torch.nn.Linear(config.hidden_size, config.num_channels)
                           if kind == "decay" and config.input_decay else None)
        self.norm = (ChannelRMSNorm(config.num_channels, config.channel_width, config.norm_eps,
                                    config.decay_norm_gain_init)
                     if kind == "decay" and config.decay_norm == "rmsnorm" else None)
        # The slope: the softmax of Eq. 3 (outputs averaged) and Eq. 16's state (the average);
        # the decay: Eq. 19's raw sum, its output averaged under decay_norm: sum.
        average = kind == "slope" or config.decay_norm == "sum"
        self.history = History(tuple(log_decay_values(kind, config.num_channels)), average_output=average,
                               average_state=kind == "slope")

    def reset_parameters(self) -> None:
        if self.norm is not None:
            self.norm.reset_parameters()
        if self.decay_gate is not None:  # the paper's fixed decays to begin with
            torch.nn.init.zeros_(self.decay_gate.weight)
            alphas = torch.tensor(decay_rates(self.decay_gate.out_features), dtype=torch.float64)
            self.decay_gate.bias.copy_(torch.logit(alphas))

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """The input-dependent decays' logs, ``[..., C]`` fp32 from the block's input ``[..., D]``."""
        gate = self.decay_gate
        return F.logsigmoid(F.linear(x.float(), gate.weight.float(), gate.bias.float()))

    def gate(self, mixed: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """Eq. 6 (slope) or Eq. 12 (decay) from the mixed history and the current branch."""
        if self.kind == "slope":
            return F.silu(mixed) * current
        normalised = self.norm(mixed) if self.norm is not None else mixed  # averaged by the history otherwise
        return normalised * torch.sigmoid(current)


class MCSDBlock(TokenMixer):
    """The MCSD block: one grouped projection into every section's two branches (Eqs. 1 and 7),
    the sections side by side, fused and projected back to D.

    Initialisation: Normal(0, init_std) projections (drawn section by section), decay RMSNorm
    gains at ``decay_norm_gain_init``; ``out_proj`` writes into the residual stream (the
    skeleton scales it to init_std / sqrt(2 L)).
    """

    def __init__(self, config: MCSDConfig) -> None:
        super().__init__()
        self.fusion = config.fusion
        self.init_std = config.init_std
        self.num_channels = config.num_channels
        self.channel_width = config.channel_width
        self.sections = torch.nn.ModuleList(Section(kind, config) for kind in config.sections)
        self.short_conv = ShortConvolution(config.hidden_size, config.short_conv) if config.short_conv else None
        # Per channel, per section: (U, V) for a slope, (F, E) for a decay.
        self.in_proj = GroupedLinear(config.num_channels, config.channel_width,
                                     2 * len(self.sections) * config.channel_width, config.init_std)
        fused_width = config.hidden_size * (len(config.sections) if config.fusion == "concat" else 1)
        self.out_proj = torch.nn.Linear(fused_width, config.hidden_size, bias=False)
        self.register_load_state_dict_pre_hook(_merge_section_projections)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        for section, weight in zip(self.sections, self.in_proj.weight.chunk(len(self.sections), dim=-1)):
            # Drawn per section, in order, as when each section had its own projection.
            weight.copy_(torch.empty_like(weight).normal_(std=self.init_std))
            section.reset_parameters()
        torch.nn.init.normal_(self.out_proj.weight, std=self.init_std)
        if self.short_conv is not None:
            self.short_conv.reset_parameters()

    def residual_weights(self) -> list[torch.nn.Parameter]:
        return [self.out_proj.weight]

    sequence_backward_factor = 1  # the filters' matrices are fixed: only their input has a gradient

    def sequence_flops(self, length: int, context: ForwardContext) -> int:
        """Each section's exponential filter over every channel (``C Dc`` features); the slope's
        denominators, the gates and the fusion are elementwise."""
        width = self.num_channels * self.channel_width
        fixed = sum(section.decay_gate is None for section in self.sections)
        gated = (len(self.sections) - fixed) * self.num_channels * decayed_attention_flops(
            length, 1, self.channel_width, context.form, context.chunk_size)
        return fixed * exp_filter_flops(length, width, context.form, context.chunk_size) + gated

    def section_inputs(self, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``x`` ``[..., D]`` -> each section's (current, history) branches, ``[..., C, Dc]`` each."""
        projected = self.in_proj(x.view(*x.shape[:-1], self.num_channels, self.channel_width))
        return list(zip(*[iter(projected.split(self.channel_width, dim=-1))] * 2))

    separates_documents = True  # the histories restart at each document (filter_histories' context)

    def forward(
        self, x: torch.Tensor, layer_state: list[torch.Tensor] | None, position: int, context: ForwardContext,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        batch, length, hidden = x.shape
        section_states, conv_state = self.split_state(layer_state)
        if self.short_conv is not None:
            x, conv_state = self.short_conv(x, conv_state, context.position_ids)
        inputs = self.section_inputs(x)
        fixed = [index for index, section in enumerate(self.sections) if section.decay_gate is None]
        mixed: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(self.sections)
        if fixed:
            filtered = filter_histories([inputs[index][1] for index in fixed],
                                        [self.sections[index].history for index in fixed],
                                        None if section_states is None else [section_states[index] for index in fixed],
                                        position, context)
            for index, result in zip(fixed, filtered):
                mixed[index] = result
        for index, section in enumerate(self.sections):
            if section.decay_gate is not None:
                mixed[index] = self.gated_history(section.log_decay(x), inputs[index][1],
                                                  None if section_states is None else section_states[index],
                                                  position, context)
        thetas = [section.gate(history, current) for section, (current, _), (history, _) in zip(self.sections, inputs, mixed)]
        states = [state for _, state in mixed] + ([conv_state] if self.short_conv is not None else [])
        return self.out_proj(self.fuse(thetas, batch, length, hidden)), states

    def split_state(self, layer_state: list[torch.Tensor] | None) -> tuple[list[torch.Tensor] | None, torch.Tensor | None]:
        """The layer's state as (each section's state, the convolution's), ``None`` at the start."""
        if layer_state is None:
            return None, None
        return layer_state[:len(self.sections)], layer_state[len(self.sections)] if self.short_conv is not None else None

    def gated_history(
        self, log_decay: torch.Tensor, history: torch.Tensor, state: torch.Tensor | None, position: int,
        context: ForwardContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """An input-decay section's mixed history ``[B, N, C, Dc]`` and state ``[B, C, Dc]`` fp32:
        the decayed sum up to each token's predecessor times the token's decay (row 0 of a
        sequence or document: the token itself)."""
        batch, length, channels, width = history.shape
        value = history.transpose(1, 2)  # [B, C, N, Dc]
        ones = value.new_ones(batch, channels, length, 1)
        log_decay = log_decay.transpose(1, 2)  # [B, C, N]
        starts, initial = context.starts, None if state is None else state[:, :, None]
        # sums[n] = sum_{j<=n} (prod_{j<r<=n} alpha_r) E_j
        sums, final = decayed_attention(ones, ones, value, log_decay, initial, context)
        before = sums.new_zeros(batch, channels, 1, width) if state is None else state[:, :, None].to(sums.dtype)
        earlier = torch.cat([before, sums[:, :, :-1]], dim=2)
        mixed = torch.exp(log_decay)[..., None].to(sums.dtype) * earlier
        first = (torch.arange(length, device=history.device)[None, :] + position == 0) if starts is None else starts
        mixed = torch.where(first[:, None, :, None], value, mixed)
        return mixed.transpose(1, 2), final[:, :, 0]

    def step(
        self, x: torch.Tensor, layer_state: list[torch.Tensor] | None, position: int | torch.Tensor,
        context: ForwardContext,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One token per row, ``x`` ``[B, D]``: the recurrent form without its sequence axis,
        the section states advanced in place, each section's step through the dispatcher (fla's
        fused recurrence where ``context.kernels`` says so)."""
        batch, hidden = x.shape
        section_states, conv_state = self.split_state(layer_state)
        if self.short_conv is not None:
            x, conv_state = self.short_conv.step(x, conv_state)
        if section_states is None:
            section_states = [x.new_zeros(batch, self.num_channels, self.channel_width, dtype=torch.float32)
                              for _ in self.sections]
        thetas = []
        for section, (current, history), state in zip(self.sections, self.section_inputs(x), section_states):
            if section.decay_gate is None:
                mixed = history_step(history, section.history, state, position, context)
            else:
                mixed = gated_history_step(history, section.log_decay(x), state, position, context)
            thetas.append(section.gate(mixed, current))
        states = section_states + ([conv_state] if self.short_conv is not None else [])
        return self.out_proj(self.fuse(thetas, batch, 1, hidden)).view(batch, hidden), states


    def fuse(self, thetas: list[torch.Tensor], batch: int, length: int, hidden: int) -> torch.Tensor:
        """Eq. 13 (per-channel concatenation) or Eq. 20 (element-wise sum), ``[B, N, fused]``."""
        if self.fusion == "concat":
            return torch.cat(thetas, dim=-1).reshape(batch, length, -1)
        return torch.stack(thetas).sum(0).reshape(batch, length, hidden)


def gated_history_step(
    value: torch.Tensor, log_decay: torch.Tensor, state: torch.Tensor, position: int | torch.Tensor,
    context: ForwardContext = STEP,
) -> torch.Tensor:
    """One token of an input-decay section: ``value`` ``[B, C, Dc]``, its decays' logs ``[B, C]``;
    the mixed history (``alpha_n`` times the sum before it; at position 0 the token itself), with
    ``state`` ``[B, C, Dc]`` fp32 advanced in place to the sum up to this token (decayed attention's
    step with unit queries and keys, through the dispatcher)."""
    earlier = (torch.exp(log_decay)[..., None] * state).to(value.dtype)
    if isinstance(position, torch.Tensor):  # 0-d, or [B]: each row at its own position
        output = torch.where((position == 0).view(-1, *([1] * (value.dim() - 1))), value, earlier)
    else:
        output = value if position == 0 else earlier
    ones = value.new_ones(*value.shape[:2], 1)
    _, advanced = decayed_attention_step(ones, ones, value, log_decay, state[:, :, None], context)
    state.copy_(advanced[:, :, 0])
    return output


def _merge_section_projections(module: torch.nn.Module, state_dict: dict, prefix: str, *args: object) -> None:
    """Load weights saved when each section had its own projection (``sections.i.proj.weight``)
    into the block's single ``in_proj``."""
    old = [f"{prefix}sections.{index}.proj.weight" for index in range(len(module.sections))]
    if all(key in state_dict for key in old):
        state_dict[f"{prefix}in_proj.weight"] = torch.cat([state_dict.pop(key) for key in old], dim=-1)
