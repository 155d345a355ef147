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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mcsd.models.mcsd.configuration_mcsd import MCSDConfig
from mcsd.models.modules.decays import log_decay_values, section_log_decay
from mcsd.models.modules.layers import ChannelRMSNorm, GroupedLinear
from mcsd.models.modules.mixer import TokenMixer
from mcsd.ops.exp_filter import History, exp_filter_matrix, filter_histories, history_step, history_weight_sum
from mcsd.ops.flops import exp_filter_flops


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
        self.chunk_size = config.chunk_size
        self.kernels = config.kernels
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
        return len(self.sections) * exp_filter_flops(length, width, form, self.chunk_size)

    def section_inputs(self, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``x`` ``[..., D]`` -> each section's (current, history) branches, ``[..., C, Dc]`` each."""
        projected = self.in_proj(x.view(*x.shape[:-1], self.num_channels, self.channel_width))
        return list(zip(*[iter(projected.split(self.channel_width, dim=-1))] * 2))

    separates_documents = True  # the histories restart at each document (filter_histories' position_ids)

    def forward(
        self, x: torch.Tensor, layer_state: list[torch.Tensor] | None, position: int, form: str,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        batch, length, hidden = x.shape
        inputs = self.section_inputs(x)
        mixed = filter_histories([history for _, history in inputs], [section.history for section in self.sections],
                                 layer_state, position, form, self.chunk_size, self.kernels, position_ids)
        thetas = [section.gate(history, current) for section, (current, _), (history, _) in zip(self.sections, inputs, mixed)]
        return self.out_proj(self.fuse(thetas, batch, length, hidden)), [state for _, state in mixed]

    def step(
        self, x: torch.Tensor, layer_state: list[torch.Tensor] | None, position: int | torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One token per row, ``x`` ``[B, D]``: the recurrent form without its sequence axis,
        the section states advanced in place."""
        batch, hidden = x.shape
        if layer_state is None:
            layer_state = [x.new_zeros(batch, self.num_channels, self.channel_width, dtype=torch.float32)
                           for _ in self.sections]
        thetas = [section.gate(history_step(history, section.history, state, position), current)
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
