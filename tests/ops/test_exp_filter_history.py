"""The exponential filter read at absolute positions (``mcsd.ops.exp_filter.history``): each
reading is the written weighted sum or average with row 0 the token itself, every form and the
step give it, continuing a state at any position equals filtering the whole sequence, and
several groups filtered together equal each filtered alone. The decays and their powers are
fp32 constants whatever the input (the spec), so fp64 inputs agree to fp32's round-off."""

from __future__ import annotations

import pytest
import torch

from helpers.models import relative_rms_error
from mcsd.ops.context import ForwardContext
from mcsd.ops.exp_filter import History, filter_histories, history_step

LOG_DECAY = (-0.25, -(2.0**-8), -(2.0**-14))
READINGS = {
    "sum": History(LOG_DECAY),
    "average": History(LOG_DECAY, average_output=True, average_state=True),
    "averaged_sum": History(LOG_DECAY, average_output=True),
}
FORMS = ["parallel", "chunk", "recurrent"]


def written_history(x: torch.Tensor, group: History) -> torch.Tensor:
    """Row n of ``x`` ``[B, N, C, D]`` as loops in fp64: ``sum_{j<n} a^(n-j) x_j``, divided by
    ``sum_{k=1}^{n} a^k`` where the output is averaged; row 0 is ``x_0``."""
    x = x.double()
    rows = [x[:, 0]]
    for n in range(1, x.shape[1]):
        weights = torch.tensor([[a ** (n - j) for j in range(n)] for a in torch.tensor(group.log_decay).double().exp()],
                               dtype=torch.float64)  # [C, n]
        row = torch.einsum("cj,bjcd->bcd", weights, x[:, :n])
        rows.append(row / weights.sum(-1)[None, :, None] if group.average_output else row)
    return torch.stack(rows, dim=1)


@pytest.mark.parametrize("reading", READINGS)
@pytest.mark.parametrize("form", FORMS)
def test_each_reading_is_the_written_history(reading: str, form: str) -> None:
    x = torch.randn(2, 40, 3, 4, dtype=torch.float64)
    mixed, _ = filter_histories([x], [READINGS[reading]], None, 0, context=ForwardContext(form, chunk_size=16))[0]
    assert relative_rms_error(mixed, written_history(x, READINGS[reading])) < 1e-6


@pytest.mark.parametrize("reading", READINGS)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("split", [1, 17, 64])
def test_continuing_a_state_equals_the_whole_sequence(reading: str, form: str, split: int) -> None:
    """A prefix in one form, its state handed to the rest in ``form`` at position ``split``:
    the outputs and the final state equal one pass over the whole sequence."""
    group = READINGS[reading]
    x = torch.randn(2, 90, 3, 4, dtype=torch.float64)
    whole, whole_state = filter_histories([x], [group], None, 0, context=ForwardContext("parallel"))[0]
    head, state = filter_histories([x[:, :split]], [group], None, 0, context=ForwardContext("chunk", chunk_size=16))[0]
    tail, final = filter_histories([x[:, split:]], [group], [state], split,
            context=ForwardContext(form, chunk_size=16))[0]
    assert relative_rms_error(torch.cat([head, tail], dim=1), whole) < 1e-6
    assert relative_rms_error(final, whole_state) < 1e-6


@pytest.mark.parametrize("form", FORMS)
def test_a_16_bit_input_keeps_an_fp32_state(form: str) -> None:
    x = torch.randn(2, 20, 3, 4).bfloat16()
    mixed, state = filter_histories([x], [READINGS["average"]], None, 0, context=ForwardContext(form, chunk_size=8))[0]
    expected = written_history(x.double(), READINGS["average"])
    assert mixed.dtype == torch.bfloat16 and state.dtype == torch.float32
    assert relative_rms_error(mixed, expected) < 1e-2


@pytest.mark.parametrize("reading", READINGS)
def test_the_step_at_a_tensor_position_equals_the_step_at_an_int(reading: str) -> None:
    """The step replayed at fixed addresses is given its position as a tensor: same outputs, same
    states, bit for bit."""
    group = READINGS[reading]
    x = torch.randn(2, 12, 3, 4)
    by_int, by_tensor = torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)
    for position in range(12):
        expected = history_step(x[:, position], group, by_int, position)
        actual = history_step(x[:, position], group, by_tensor, torch.tensor(position))
        assert torch.equal(actual, expected) and torch.equal(by_tensor, by_int)


def test_groups_filtered_together_equal_each_alone() -> None:
    """The chunk form filters several groups in one call over all their channels: each group's
    output and state are what it gets alone, and each state is a tensor of its own."""
    groups = [READINGS["average"], READINGS["sum"], History((-0.5, -0.1), average_output=True)]
    histories = [torch.randn(2, 70, group.num_channels, 4) for group in groups]
    starts = [torch.randn(2, group.num_channels, 4) for group in groups]
    together = filter_histories(histories, groups, starts, 5, context=ForwardContext("chunk", chunk_size=16))
    for (mixed, state), history, group, start in zip(together, histories, groups, starts):
        alone, alone_state = filter_histories([history], [group], [start], 5,
                context=ForwardContext("chunk", chunk_size=16))[0]
        assert relative_rms_error(mixed, alone) < 1e-6 and relative_rms_error(state, alone_state) < 1e-6
    assert len({state.data_ptr() for _, state in together}) == len(groups)


def test_an_average_state_needs_an_averaged_output() -> None:
    with pytest.raises(ValueError, match="average_state needs average_output"):
        History(LOG_DECAY, average_state=True)


def test_tables_first_built_in_inference_mode_serve_a_graph_later() -> None:
    """The cached per-position tables and decay factors are plain tensors even when first built
    under ``torch.inference_mode`` (generate's): a later step that builds a graph (training after
    sampling) saves them for its backward."""
    group = History((-0.0123, -0.0456), average_output=True, average_state=True)  # decays no other test uses
    raw = History((-0.0789,), average_output=True)
    value = torch.randn(2, 2, 4)
    with torch.inference_mode():
        history_step(value, group, torch.zeros(2, 2, 4), 3)
        history_step(value[:, :1], raw, torch.zeros(2, 1, 4), 3)
    leaf = value.clone().requires_grad_()
    state, raw_state = torch.zeros(2, 2, 4), torch.zeros(2, 1, 4)
    output = history_step(leaf, group, state, 3)
    raw_output = history_step(leaf[:, :1], raw, raw_state, 3)
    (output.sum() + state.sum() + raw_output.sum() + raw_state.sum()).backward()
    assert leaf.grad is not None and bool(leaf.grad.abs().sum() > 0)
