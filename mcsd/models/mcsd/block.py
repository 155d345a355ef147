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
fixed per-channel decay (``exp(-beta_i)`` resp. ``alpha_i``); the slope's softmax
denominator is a known function of the absolute position. Sections are fused by
per-channel concatenation and the output projection (Eq. 13) or by summation (Eq. 20).

Decoding state per section: ``[B, C, Dc]`` fp32. The slope keeps the normalised average
``V'`` of the tokens seen (the convex update of Eq. 16); the decay keeps the unnormalised
sum ``sum_j alpha^(n-j) E_j`` (Eq. 19).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from mcsd.models.mcsd.configuration_mcsd import MCSDConfig
from mcsd.models.modules.decays import section_log_decay
from mcsd.models.modules.layers import ChannelRMSNorm, GroupedLinear
from mcsd.models.modules.mixer import TokenMixer
from mcsd.ops.exp_filter import exp_filter, exp_filter_matrix
from mcsd.ops.flops import exp_filter_flops


def geometric_sum(log_decay: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``sum_{k=0}^{count-1} a^k`` per channel and count, ``[C, len(count)]``, fp32.

    ``expm1`` keeps it exact for decays close to 1.
    """
    log_decay = log_decay.float()[:, None]
    return torch.expm1(count.float()[None, :] * log_decay) / torch.expm1(log_decay)


def history_weight_sum(log_decay: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The sum of row n's history weights, ``sum_{k=1}^{n} a^k``: the softmax denominator of
    Eq. 3 (slope), or the decay's divisor under ``decay_norm: sum``.

    Position 0 (whose row is token 0 itself) gets 1 so that dividing there is harmless.
    """
    denominator = torch.exp(log_decay.float())[:, None] * geometric_sum(log_decay, positions)
    return torch.where(positions[None, :] == 0, torch.ones_like(denominator), denominator)


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
    """One slope or decay section: the history mixing of its branch (:meth:`mix`) and the gate
    that makes ``Theta`` ``[B, N, C, Dc]`` of it (:meth:`gate`). Its projections are the block's
    (one grouped projection for every section), and a block of several sections filters their
    histories together (:meth:`filter_state`, :meth:`finish`)."""

    def __init__(self, kind: str, config: MCSDConfig) -> None:
        super().__init__()
        self.kind = kind
        self.num_channels = config.num_channels
        self.chunk_size = config.chunk_size
        self.kernels = config.kernels
        width = config.channel_width
        self.norm = (ChannelRMSNorm(config.num_channels, width, config.norm_eps, config.decay_norm_gain_init)
                     if kind == "decay" and config.decay_norm == "rmsnorm" else None)
        self.average_decay = kind == "decay" and config.decay_norm == "sum"

    def reset_parameters(self) -> None:
        if self.norm is not None:
            self.norm.reset_parameters()

    def log_decay(self, device: torch.device) -> torch.Tensor:
        return section_log_decay(self.kind, self.num_channels, device)

    def gate(self, mixed: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """Eq. 6 (slope) or Eq. 12 (decay) from the mixed history and the current branch."""
        if self.kind == "slope":
            return F.silu(mixed) * current
        normalised = self.norm(mixed) if self.norm is not None else mixed  # averaged in mix() otherwise
        return normalised * torch.sigmoid(current)

    def mix(
        self, values: torch.Tensor, state: torch.Tensor | None, position: int, form: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``W_s V`` or ``W_d E`` for ``values`` ``[B, N, C, Dc]`` at absolute positions
        ``position..``, continuing ``state``; returns the result and the new state."""
        if form == "recurrent":
            if state is None:
                batch, _, channels, width = values.shape
                state = values.new_zeros(batch, channels, width, dtype=torch.float32)
            outputs = [self.mix_step(values[:, offset], state, position + offset) for offset in range(values.shape[1])]
            return torch.stack(outputs, dim=1), state
        channels_first = values.transpose(1, 2)  # [B, C, N, Dc]
        log_decay = self.log_decay(values.device)
        filtered, final = exp_filter(channels_first, log_decay, self.filter_state(state, position), form, self.chunk_size,
                                     self.kernels)
        return self.finish(filtered, final, channels_first, position)

    def filter_state(self, state: torch.Tensor | None, position: int) -> torch.Tensor | None:
        """The exponential filter's initial state from this section's state: the decay's raw sum
        itself; the slope's normalised average times its weight sum (the filter carries raw sums)."""
        if self.kind != "slope" or state is None:
            return state
        log_decay = self.log_decay(state.device)
        return state * history_weight_sum(log_decay, torch.tensor([position], device=state.device))[None]

    def finish(
        self, filtered: torch.Tensor, final: torch.Tensor, channels_first: torch.Tensor, position: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """From the filter's raw output ``[B, C, N, Dc]`` and final state to this section's mixed
        history ``[B, N, C, Dc]`` and state: the slope's softmax denominators (Eq. 3), the decay's
        row sums under ``decay_norm: sum``, and row 0 (token 0 itself) at the sequence start."""
        length = filtered.shape[2]
        log_decay = self.log_decay(filtered.device)
        if self.kind == "slope":
            positions = torch.arange(position, position + length + 1, device=filtered.device)
            denominator = history_weight_sum(log_decay, positions)[None, :, :, None]
            filtered = filtered / denominator[:, :, :length]
            final = final / denominator[:, :, -1]
        elif self.average_decay:  # the state stays the raw sum of Eq. 19; only the output is divided
            positions = torch.arange(position, position + length, device=filtered.device)
            filtered = filtered / history_weight_sum(log_decay, positions)[None, :, :, None]
        if position == 0:  # row 0 of Eqs. 3 and 9: token 0 itself (the paper's "first number 1"),
            # added in place to the filter's output there, which is exactly 0 (no history, no state).
            filtered[:, :, 0] += channels_first[:, :, 0].to(filtered.dtype)
        # The fp32 denominators promote a 16-bit model's output: back to the model's dtype (the
        # state stays fp32).
        return filtered.transpose(1, 2).to(channels_first.dtype), final

    def mix_step(self, value: torch.Tensor, state: torch.Tensor, position: int | torch.Tensor) -> torch.Tensor:
        """One token ``value`` ``[B, C, Dc]`` at absolute ``position``: its mixed history, with
        ``state`` ``[B, C, Dc]`` fp32 advanced in place: Eq. 16 (slope: ``S <- S + (V_n - S) / Z``,
        ``Z = sum_{k=0}^{n} exp(-k beta)``) or Eq. 19 (decay: ``S <- alpha (S + E_n)``). The
        per-position constants come from tables built once (:func:`position_constants`). A
        ``position`` tensor (the step at fixed addresses) picks token 0's row without a branch."""
        if isinstance(position, torch.Tensor):
            output = torch.where(position == 0, value, state.to(value.dtype))  # a new tensor
        else:
            output = value if position == 0 else state.to(value.dtype)
            if output is state:  # the state is about to change in place
                output = state.clone()
        if self.kind == "slope":
            weight = position_constants("slope_update", self.num_channels, value.device, position)[:, None]
            state.add_((value.float() - state).mul_(weight))
            return output
        if self.average_decay and (isinstance(position, torch.Tensor) or position > 0):
            # The row sum is 1 at position 0 (history_weight_sum), where a tensor position divides too.
            divisor = position_constants("history_sum", self.num_channels, value.device, position)[:, None]
            output = (output / divisor).to(value.dtype)
        state.add_(value.to(state.dtype)).mul_(decay_factors(self.num_channels, value.device)[:, None])
        return output


def decay_factors(num_channels: int, device: torch.device) -> torch.Tensor:
    """The decay section's ``alpha_i`` ``[C]`` fp32, from its log (as the filter computes it);
    cached for eager calls, a constant of a compiled graph."""
    if torch.compiler.is_compiling():
        return torch.exp(section_log_decay("decay", num_channels, device))
    return _decay_factors(num_channels, device)


@functools.lru_cache(maxsize=None)
def _decay_factors(num_channels: int, device: torch.device) -> torch.Tensor:
    return torch.exp(section_log_decay("decay", num_channels, device))


def position_constants(
    quantity: str, num_channels: int, device: torch.device, position: int | torch.Tensor
) -> torch.Tensor:
    """A per-position constant of decoding, ``[C]`` at ``position`` n:

    - ``slope_update``: the slope state's update weight, ``1 / sum_{k=0}^{n} exp(-k beta)``;
    - ``history_sum``: the decay history's row sum, ``sum_{k=1}^{n} alpha^k`` (the divisor
      under ``decay_norm: sum``).

    Eager calls read a column of a cached table (``[C, L]``, ``L`` a power of two of at least
    1024, so decoding builds a handful in all); a compiled step computes it in its graph, with
    ``position`` symbolic (one graph for every position), as does a step given ``position`` as a
    0-d tensor on the device (the step at fixed addresses).
    """
    if isinstance(position, torch.Tensor):
        return _position_values(quantity, num_channels, position.reshape(1))[:, 0]
    if torch.compiler.is_compiling():
        return _position_values(quantity, num_channels, torch.full((1,), position, device=device))[:, 0]
    return _position_table(quantity, num_channels, device, max(1024, 1 << position.bit_length()))[:, position]


@functools.lru_cache(maxsize=16)
def _position_table(quantity: str, num_channels: int, device: torch.device, length: int) -> torch.Tensor:
    return _position_values(quantity, num_channels, torch.arange(length, device=device))


def _position_values(quantity: str, num_channels: int, positions: torch.Tensor) -> torch.Tensor:
    kind = "slope" if quantity == "slope_update" else "decay"
    log_decay = section_log_decay(kind, num_channels, positions.device)  # no host copy in a CUDA graph's capture
    if quantity == "slope_update":
        return 1.0 / geometric_sum(log_decay, positions + 1)
    return history_weight_sum(log_decay, positions)


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

    def residual_weights(self) -> list[torch.nn.Parameter]:
        return [self.out_proj.weight]

    sequence_backward_factor = 1  # the filters' matrices are fixed: only their input has a gradient

    def sequence_flops(self, length: int, form: str) -> int:
        """Each section's exponential filter over every channel (``C Dc`` features); the slope's
        denominators, the gates and the fusion are elementwise."""
        width = self.num_channels * self.channel_width
        return sum(exp_filter_flops(length, width, form, section.chunk_size) for section in self.sections)

    def section_inputs(self, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``x`` ``[..., D]`` -> each section's (current, history) branches, ``[..., C, Dc]`` each."""
        projected = self.in_proj(x.view(*x.shape[:-1], self.num_channels, self.channel_width))
        return list(zip(*[iter(projected.split(self.channel_width, dim=-1))] * 2))

    def forward(
        self, x: torch.Tensor, layer_state: list[torch.Tensor] | None, position: int, form: str
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        batch, length, hidden = x.shape
        states = layer_state if layer_state is not None else [None] * len(self.sections)
        inputs = self.section_inputs(x)
        # The chunk form filters all sections together (fewer, larger products); the parallel form
        # filters each section alone: its [C, N+1, N] matrices are large already, and one of twice
        # their size cost more in fresh pages than the shared call saved (0.7x at 1024 tokens).
        if form != "chunk" or len(self.sections) == 1:
            mixed = [section.mix(history, state, position, form)
                     for section, (_, history), state in zip(self.sections, inputs, states)]
        else:
            mixed = self._mix_together([history for _, history in inputs], states, position, form)
        thetas = [section.gate(history, current) for section, (current, _), (history, _) in zip(self.sections, inputs, mixed)]
        return self.out_proj(self.fuse(thetas, batch, length, hidden)), [state for _, state in mixed]

    def _mix_together(
        self, histories: list[torch.Tensor], states: list[torch.Tensor | None], position: int, form: str
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every section's :meth:`Section.mix` through one exponential filter over all their
        channels (``S * C``, each with its own decay): one set of batched products per layer
        (what the chunk form uses)."""
        channels_first = torch.cat(histories, dim=2).transpose(1, 2)  # [B, S * C, N, Dc]
        log_decay = torch.cat([section.log_decay(channels_first.device) for section in self.sections])
        initial = None
        if states[0] is not None:
            initial = torch.cat([section.filter_state(state, position) for section, state in zip(self.sections, states)],
                                dim=1)
        filtered, final = exp_filter(channels_first, log_decay, initial, form, self.sections[0].chunk_size,
                                     self.sections[0].kernels)
        # Slices, not split(): finish() may add token 0's row in place, which autograd allows on a view
        # of one slice but not on one of split()'s several. Each state a tensor of its own: decoding
        # advances them in place, and a compiled step given views of one base (two decay sections'
        # states) fails in inductor (torch 2.13, 16-bit models).
        channels = [slice(index * self.num_channels, (index + 1) * self.num_channels) for index in range(len(self.sections))]
        return [section.finish(filtered[:, part], final[:, part].clone(), channels_first[:, part], position)
                for part, section in zip(channels, self.sections)]

    def step(
        self, x: torch.Tensor, layer_state: list[torch.Tensor] | None, position: int | torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One token per row, ``x`` ``[B, D]``: the recurrent form without its sequence axis,
        the section states advanced in place."""
        batch, hidden = x.shape
        if layer_state is None:
            layer_state = [x.new_zeros(batch, self.num_channels, self.channel_width, dtype=torch.float32)
                           for _ in self.sections]
        thetas = [section.gate(section.mix_step(history, state, position), current)
                  for section, (current, history), state in zip(self.sections, self.section_inputs(x), layer_state)]
        return self.out_proj(self.fuse(thetas, batch, 1, hidden)).view(batch, hidden), layer_state

    def fuse(self, thetas: list[torch.Tensor], batch: int, length: int, hidden: int) -> torch.Tensor:
        """Eq. 13 (per-channel concatenation) or Eq. 20 (element-wise sum), ``[B, N, fused]``."""
        if self.fusion == "concat":
            return torch.cat(thetas, dim=-1).reshape(batch, length, -1)
        return torch.stack(thetas).sum(0).reshape(batch, length, hidden)


def _merge_section_projections(module: torch.nn.Module, state_dict: dict, prefix: str, *args: object) -> None:
    """Load weights saved when each section had its own projection (``sections.i.proj.weight``)
    into the block's single ``in_proj``."""
    old = [f"{prefix}sections.{index}.proj.weight" for index in range(len(module.sections))]
    if all(key in state_dict for key in old):
        state_dict[f"{prefix}in_proj.weight"] = torch.cat([state_dict.pop(key) for key in old], dim=-1)
