"""The exponential filter read at absolute positions: MCSD's histories, in every form.

A :class:`History` is a group of channels with fixed decays filtered from absolute position 0,
whose row ``n`` is read one of two ways:

- as the raw sum ``sum_{j<n} a^(n-j) x_j`` (the decay section, Eqs. 9 and 19), or
- divided by its weight sum ``sum_{k=1}^{n} a^k`` (``average_output``: the slope section's
  softmax of Eq. 3, or the decay section under ``decay_norm: sum``),

with row 0 (no history yet) the token itself (the paper's "first number 1"). Its decoding
state ``[B, C, D]`` fp32 is the raw sum (Eq. 19: ``S <- a (S + x_n)``) or, with
``average_state``, the running average itself (Eq. 16's convex update
``S <- S + (x_n - S) / Z_n``, ``Z_n = sum_{k=0}^{n} a^k``): the slope keeps the average, which
stays in the range of its inputs at any length.

The sequence forms run the exponential filter (:func:`mcsd.ops.exp_filter.exp_filter`, raw sums)
and convert at the boundaries: an averaged state times its weight sum on the way in, outputs and
the final state divided on the way out. The recurrent form is the step (:func:`history_step`)
token by token, or fla's fused recurrence of the filter where ``kernels`` says so; the step
itself goes through the dispatcher too. Per-position constants come from tables built once per decay (eager calls) or
are computed in a compiled graph (a symbolic or tensor position: one graph for every position).

Documents apart in a packed batch (``position_ids`` ``[B, N]``: each token's position in its own
document, 0 where one starts): the filter drops the state at every start, every divisor is read
at the position in the document, and every document's first row is its token itself.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mcsd.ops.common import cached_tensors, constant_tensor
from mcsd.ops.context import STEP, ForwardContext
from mcsd.ops.dispatch import dispatch
from mcsd.ops.exp_filter.filter import exp_filter
from mcsd.ops.exp_filter.fla_backend import fla_exp_filter
from mcsd.ops.exp_filter.recurrent import absorb_average_, absorb_sum_


@dataclass(frozen=True)
class History:
    """One group of channels: ``log_decay`` per channel (fp64 values: hashable, so tables of
    per-position constants are shared by every layer with the same decays) and how it is read."""

    log_decay: tuple[float, ...]
    average_output: bool = False
    average_state: bool = False

    def __post_init__(self) -> None:
        if self.average_state and not self.average_output:
            raise ValueError("History: average_state needs average_output (the average is what it keeps)")

    @property
    def num_channels(self) -> int:
        return len(self.log_decay)

    def log_decay_tensor(self, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``[C]`` (fp32 unless ``dtype``): cached for eager calls, a constant of a compiled graph."""
        return constant_tensor(self.log_decay, device, dtype)


def geometric_sum(log_decay: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``sum_{k=0}^{count-1} a^k`` per channel and count, ``[C, *count.shape]``, fp32.

    ``expm1`` keeps it exact for decays close to 1.
    """
    log_decay = log_decay.float().view(-1, *([1] * count.dim()))
    return torch.expm1(count.float()[None] * log_decay) / torch.expm1(log_decay)


def history_weight_sum(log_decay: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The sum of row n's history weights, ``sum_{k=1}^{n} a^k``, ``[C, *positions.shape]``: the
    divisor of an averaged output. Position 0 (whose row is the token itself) gets 1 so that
    dividing there is harmless."""
    denominator = torch.exp(log_decay.float()).view(-1, *([1] * positions.dim())) * geometric_sum(log_decay, positions)
    return torch.where(positions[None] == 0, torch.ones_like(denominator), denominator)


def _row_weight_sums(log_decay: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """:func:`history_weight_sum` at per-row positions ``[B, *]``, batch first: ``[B, C, *]``."""
    return history_weight_sum(log_decay, positions).transpose(0, 1)


def filter_histories(
    histories: Sequence[torch.Tensor], groups: Sequence[History], states: Sequence[torch.Tensor | None] | None,
    position: int, context: ForwardContext,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each group's history ``[B, N, C, D]`` (channels last, as a block's projection gives them)
    in ``context``'s form at absolute positions ``position..`` (or, where ``context`` keeps
    documents apart, at each token's position in its document), continuing its state (``None``:
    from nothing);
    returns each group's ``(mixed [B, N, C, D] in the input's dtype, state [B, C, D] fp32)``.

    The chunk form filters every group together (one set of batched products over all their
    channels); the parallel form filters each group alone (its ``[C, N+1, N]`` matrices are large
    already: one of twice their size cost more in fresh pages than the shared call saved, 0.7x at
    1024 tokens); the recurrent form is :func:`history_step` token by token in PyTorch, and fla's
    fused recurrence over every group together where ``context.kernels`` says so.
    """
    states = list(states) if states is not None else [None] * len(groups)
    if context.form != "recurrent":
        return _filtered_histories(histories, groups, states, position, context)
    return dispatch(context, histories[0].device,
                    {"recurrent": functools.partial(_recurrent_histories, histories, groups, states, position, context)},
                    fla=functools.partial(_filtered_histories, histories, groups, states, position, context))


def _recurrent_histories(
    histories: Sequence[torch.Tensor], groups: Sequence[History], states: list[torch.Tensor | None],
    position: int, context: ForwardContext,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The recurrent form in PyTorch: each group token by token (:func:`history_step`)."""
    if context.position_ids is not None:
        return [_recurrent_documents(history, group, state, context.position_ids, context.starts)
                for history, group, state in zip(histories, groups, states)]
    return [_recurrent_history(history, group, state, position) for history, group, state in
            zip(histories, groups, states)]


def _filtered_histories(
    histories: Sequence[torch.Tensor], groups: Sequence[History], states: list[torch.Tensor | None],
    position: int, context: ForwardContext,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The groups through the exponential filter in ``context``'s form, converted at the
    boundaries; every group together but in the parallel form."""
    position_ids = context.position_ids
    if context.form == "parallel" or len(groups) == 1:
        parts = [([history], [group], [state]) for history, group, state in zip(histories, groups, states)]
    else:
        parts = [(list(histories), list(groups), states)]
    mixed = []
    for part_histories, part_groups, part_states in parts:
        channels_first = (torch.cat(part_histories, dim=2) if len(part_histories) > 1
                          else part_histories[0]).transpose(1, 2)  # [B, C, N, D]
        log_decay = torch.cat([group.log_decay_tensor(channels_first.device) for group in part_groups])
        initial = None
        if part_states[0] is not None:
            state_position = position if position_ids is None else position_ids[:, 0]
            initial = torch.cat([_raw_state(group, state, state_position)
                                 for group, state in zip(part_groups, part_states)], dim=1)
        filtered, final = exp_filter(channels_first, log_decay, initial, context)
        # Slices, not split(): _finish may add token 0's row in place, which autograd allows on a
        # view of one slice but not on one of split()'s several. Each state a tensor of its own:
        # decoding advances them in place, and a compiled step given views of one base (two decay
        # sections' states) fails in inductor (torch 2.13, 16-bit models).
        start = 0
        for group in part_groups:
            part = slice(start, start + group.num_channels)
            start = part.stop
            final_part = final[:, part].clone() if len(part_groups) > 1 else final
            if position_ids is None:
                mixed.append(_finish(group, filtered[:, part], final_part, channels_first[:, part], position))
            else:
                mixed.append(_finish_documents(group, filtered[:, part], final_part, channels_first[:, part],
                                               position_ids, context.starts))
    return mixed


def _raw_state(group: History, state: torch.Tensor, position: int | torch.Tensor) -> torch.Tensor:
    """The filter's initial state (a raw sum) from the group's state: an average times its weight
    sum (at ``position``, or at each row's: a ``[B]`` tensor)."""
    if not group.average_state:
        return state
    log_decay = group.log_decay_tensor(state.device)
    if isinstance(position, torch.Tensor):
        return state * _row_weight_sums(log_decay, position)[:, :, None]
    return state * history_weight_sum(log_decay, torch.tensor([position], device=state.device))[None]


def _finish(
    group: History, filtered: torch.Tensor, final: torch.Tensor, channels_first: torch.Tensor, position: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """From the filter's raw output ``[B, C, N, D]`` and final state to the group's mixed history
    ``[B, N, C, D]`` and state: outputs (and an averaged state) divided by their weight sums, and
    row 0 (the token itself) at the sequence start."""
    length = filtered.shape[2]
    log_decay = group.log_decay_tensor(filtered.device)
    if group.average_state:
        positions = torch.arange(position, position + length + 1, device=filtered.device)
        denominator = history_weight_sum(log_decay, positions)[None, :, :, None]
        filtered = filtered / denominator[:, :, :length]
        final = final / denominator[:, :, -1]
    elif group.average_output:  # the state stays the raw sum; only the output is divided
        positions = torch.arange(position, position + length, device=filtered.device)
        filtered = filtered / history_weight_sum(log_decay, positions)[None, :, :, None]
    if position == 0:  # row 0: the token itself, added in place to the filter's output there,
        # which is exactly 0 (no history, no state).
        filtered[:, :, 0] += channels_first[:, :, 0].to(filtered.dtype)
    # The fp32 divisors promote a 16-bit input's output: back to its dtype (the state stays fp32).
    return filtered.transpose(1, 2).to(channels_first.dtype), final


def _finish_documents(
    group: History, filtered: torch.Tensor, final: torch.Tensor, channels_first: torch.Tensor,
    position_ids: torch.Tensor, starts: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_finish` with each token's position in its document: divisors at those positions,
    the final state's at the last document's count, and every document's row 0 its token."""
    log_decay = group.log_decay_tensor(filtered.device)
    if group.average_output:
        filtered = filtered / _row_weight_sums(log_decay, position_ids)[..., None]  # [B, C, N, 1]
    if group.average_state:
        final = final / _row_weight_sums(log_decay, position_ids[:, -1] + 1)[:, :, None]
    # Each document's first row: its token itself (the filter's output there is exactly 0).
    filtered = filtered + channels_first.to(filtered.dtype) * starts[:, None, :, None]
    return filtered.transpose(1, 2).to(channels_first.dtype), final


def _recurrent_documents(
    history: torch.Tensor, group: History, state: torch.Tensor | None, position_ids: torch.Tensor,
    starts: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrent form with documents apart, token by token: a raw sum set to zero at each
    start (an average needs nothing: its first update's weight is 1), constants per row."""
    batch, length, channels, width = history.shape
    if state is None:
        state = history.new_zeros(batch, channels, width, dtype=torch.float32)
    log_decay = group.log_decay_tensor(history.device)
    decay = torch.exp(log_decay)[:, None]  # [C, 1]
    outputs = []
    for offset in range(length):
        value, positions = history[:, offset], position_ids[:, offset]
        first = starts[:, offset, None, None]
        if not group.average_state:
            state = state * ~first
        output = torch.where(first, value, state.to(value.dtype))
        if group.average_state:
            weight = 1.0 / geometric_sum(log_decay, positions + 1).T[:, :, None]  # 1 / sum_{k=0}^{n} a^k
            state = state + (value.float() - state) * weight
        else:
            if group.average_output:
                output = (output / _row_weight_sums(log_decay, positions)[:, :, None]).to(value.dtype)
            state = decay * (state + value.float())
        outputs.append(output)
    return torch.stack(outputs, dim=1), state


def _recurrent_history(
    history: torch.Tensor, group: History, state: torch.Tensor | None, position: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if state is None:
        batch, _, channels, width = history.shape
        state = history.new_zeros(batch, channels, width, dtype=torch.float32)
    outputs = [_history_step(history[:, offset], group, state, position + offset)
               for offset in range(history.shape[1])]
    return torch.stack(outputs, dim=1), state


def history_step(
    value: torch.Tensor, group: History, state: torch.Tensor, position: int | torch.Tensor,
    context: ForwardContext = STEP,
) -> torch.Tensor:
    """One token ``value`` ``[B, C, D]`` at absolute ``position``: its mixed history, with
    ``state`` ``[B, C, D]`` fp32 advanced in place (through fla's fused recurrence where
    ``context.kernels`` says so). A ``position`` tensor (the step replayed at fixed addresses:
    0-d; a padded batch, each row at its own position: ``[B]``) picks row 0 without a branch."""
    return dispatch(context, value.device,
                    {"recurrent": functools.partial(_history_step, value, group, state, position)},
                    fla=functools.partial(_fla_history_step, value, group, state, position))


def _step_output(value: torch.Tensor, read: torch.Tensor, position: int | torch.Tensor) -> torch.Tensor:
    """The token itself at position 0, else ``read`` (the state as the history), in ``value``'s
    dtype and never the state itself (which is about to change in place)."""
    if isinstance(position, torch.Tensor):
        first = position == 0 if position.dim() == 0 else (position == 0)[:, None, None]
        return torch.where(first, value, read.to(value.dtype))  # a new tensor
    if position == 0:
        return value
    output = read.to(value.dtype)
    return output.clone() if output is read else output


def _weight_sums(group: History, device: torch.device, position: int | torch.Tensor) -> torch.Tensor:
    """:func:`history_weight_sum` at ``position``, ``[C, 1]`` (or ``[B, C, 1]``), to divide a state."""
    return position_constants("weight_sum", group, device, position)[..., None]


def _history_step(
    value: torch.Tensor, group: History, state: torch.Tensor, position: int | torch.Tensor
) -> torch.Tensor:
    output = _step_output(value, state, position)
    if group.average_state:
        absorb_average_(state, value, position_constants("average_update", group, value.device, position)[..., None])
        return output
    if group.average_output and (isinstance(position, torch.Tensor) or position > 0):
        # The weight sum is 1 at position 0 (history_weight_sum), where a tensor position divides too.
        output = (output / _weight_sums(group, value.device, position)).to(value.dtype)
    absorb_sum_(state, value, decay_factors(group, value.device)[:, None])
    return output


def _fla_history_step(
    value: torch.Tensor, group: History, state: torch.Tensor, position: int | torch.Tensor
) -> torch.Tensor:
    """:func:`history_step` through fla's fused recurrence (one token of the filter): an averaged
    state as a raw sum on the way in (times the weight sum ``W(n)``) and out (over ``W(n+1)``),
    so that the running average is exactly Eq. 16's."""
    raw = state * _weight_sums(group, value.device, position) if group.average_state else state
    read, final = fla_exp_filter(value[:, :, None], group.log_decay_tensor(value.device), raw, "recurrent")
    read = read[:, :, 0].float()
    if group.average_output and (isinstance(position, torch.Tensor) or position > 0):
        read = read / _weight_sums(group, value.device, position)
    state.copy_(final / _weight_sums(group, value.device, position + 1) if group.average_state else final)
    return _step_output(value, read, position)


def decay_factors(group: History, device: torch.device) -> torch.Tensor:
    """``a`` ``[C]`` fp32, from its log (as the filter computes it); cached for eager calls, a
    constant of a compiled graph."""
    if torch.compiler.is_compiling():
        return torch.exp(group.log_decay_tensor(device))
    return _decay_factors(group, device)


@cached_tensors()
def _decay_factors(group: History, device: torch.device) -> torch.Tensor:
    return torch.exp(group.log_decay_tensor(device))


def position_constants(quantity: str, group: History, device: torch.device, position: int | torch.Tensor) -> torch.Tensor:
    """A per-position constant of decoding, ``[C]`` at ``position`` n:

    - ``average_update``: an averaged state's update weight, ``1 / sum_{k=0}^{n} a^k``;
    - ``weight_sum``: the history's weight sum, ``sum_{k=1}^{n} a^k`` (an averaged output's divisor).

    Eager calls read a column of a cached table (``[C, L]``, ``L`` a power of two of at least
    1024, so decoding builds a handful in all); a compiled step computes it in its graph, with
    ``position`` symbolic (one graph for every position), as does a step given ``position`` as a
    0-d tensor on the device (the step at fixed addresses). Positions ``[B]`` (a padded batch,
    each row at its own position) give ``[B, C]``.
    """
    if isinstance(position, torch.Tensor):
        if position.dim() == 1:
            return _position_values(quantity, group, position).transpose(0, 1)
        return _position_values(quantity, group, position.reshape(1))[:, 0]
    if torch.compiler.is_compiling():
        return _position_values(quantity, group, torch.full((1,), position, device=device))[:, 0]
    return _position_table(quantity, group, device, max(1024, 1 << position.bit_length()))[:, position]


@cached_tensors(maxsize=16)
def _position_table(quantity: str, group: History, device: torch.device, length: int) -> torch.Tensor:
    return _position_values(quantity, group, torch.arange(length, device=device))


def _position_values(quantity: str, group: History, positions: torch.Tensor) -> torch.Tensor:
    log_decay = group.log_decay_tensor(positions.device)  # cached: no host copy in a CUDA graph's capture
    if quantity == "average_update":
        return 1.0 / geometric_sum(log_decay, positions + 1)
    return history_weight_sum(log_decay, positions)
