"""The exponential filter's parallel, chunkwise and recurrent forms are one function."""

from __future__ import annotations

import pytest
import torch

from helpers.models import relative_rms_error
from mcsd.ops.context import ForwardContext
from mcsd.ops.exp_filter import (
    chunk_exp_filter,
    exp_filter,
    parallel_exp_filter,
    recurrent_exp_filter,
)

LENGTHS = [1, 2, 63, 64, 65, 317]
CHUNK_SIZES = [1, 16, 64, 100]
# Decays as the model uses them: a fast slope (beta = 0.25), a slow slope, a slow decay.
LOG_DECAY = torch.tensor([-0.25, -(2.0**-8), -(2.0**-14)])
TOLERANCE = 1e-5


def literal_filter(x: torch.Tensor, decay: list[float], initial: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """y[n] = sum_{j<n} a^(n-j) x[j] + a^n h0, written as plain loops in float64."""
    batch, channels, length, width = x.shape
    x, initial = x.double(), initial.double()
    y = torch.zeros(batch, channels, length + 1, width, dtype=torch.float64)
    for c, a in enumerate(decay):
        for n in range(length + 1):
            y[:, c, n] = a**n * initial[:, c] + sum((a ** (n - j) * x[:, c, j] for j in range(n)), torch.zeros(1))
    return y[:, :, :length], y[:, :, length]


def test_parallel_form_is_the_written_sum() -> None:
    x, initial = torch.randn(2, 3, 9, 4), torch.randn(2, 3, 4)
    y, final = parallel_exp_filter(x, LOG_DECAY, initial)
    expected_y, expected_final = literal_filter(x, torch.exp(LOG_DECAY.double()).tolist(), initial)
    assert relative_rms_error(y, expected_y) < 1e-6
    assert relative_rms_error(final, expected_final) < 1e-6


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("with_initial_state", [False, True])
def test_forms_agree(length: int, with_initial_state: bool) -> None:
    x = torch.randn(2, 3, length, 8)
    initial = torch.randn(2, 3, 8) if with_initial_state else None
    reference, reference_final = parallel_exp_filter(x, LOG_DECAY, initial)
    recurrent, recurrent_final = recurrent_exp_filter(x, LOG_DECAY, initial)
    assert relative_rms_error(recurrent_final, reference_final) < TOLERANCE
    if length > 1:  # at length 1 without an initial state every output is exactly 0
        assert relative_rms_error(recurrent, reference) < TOLERANCE
    for chunk_size in CHUNK_SIZES:
        chunked, chunked_final = chunk_exp_filter(x, LOG_DECAY, initial, chunk_size)
        assert chunked.shape == x.shape and chunked_final.shape == (2, 3, 8)
        assert chunked_final.dtype == torch.float32
        if length > 1:
            assert relative_rms_error(chunked, reference) < TOLERANCE, chunk_size
        assert relative_rms_error(chunked_final, reference_final) < TOLERANCE, chunk_size


@pytest.mark.parametrize("length", [2, 65, 317])
def test_gradients_agree(length: int) -> None:
    """d(output, final state)/d(input, initial state) is the same in every form."""
    x, initial = torch.randn(2, 3, length, 8), torch.randn(2, 3, 8)
    output_grad, final_grad = torch.randn(2, 3, length, 8), torch.randn(2, 3, 8)

    def gradients(form: str, chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        x_leaf, initial_leaf = x.clone().requires_grad_(), initial.clone().requires_grad_()
        y, final = exp_filter(x_leaf, LOG_DECAY, initial_leaf, context=ForwardContext(form, chunk_size=chunk_size))
        ((y * output_grad).sum() + (final * final_grad).sum()).backward()
        return x_leaf.grad, initial_leaf.grad

    reference_x, reference_initial = gradients("parallel")
    for form, chunk_size in [("recurrent", 64), ("chunk", 16), ("chunk", 64), ("chunk", 7)]:
        grad_x, grad_initial = gradients(form, chunk_size)
        assert relative_rms_error(grad_x, reference_x) < TOLERANCE, (form, chunk_size)
        assert relative_rms_error(grad_initial, reference_initial) < TOLERANCE, (form, chunk_size)


def test_chunk_form_passes_gradcheck() -> None:
    x = torch.randn(1, 3, 11, 2, dtype=torch.float64, requires_grad=True)
    initial = torch.randn(1, 3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: chunk_exp_filter(a, LOG_DECAY, b, chunk_size=4), (x, initial))


@pytest.mark.parametrize("split", [1, 40, 64, 199])
def test_split_sequence_continues_from_the_final_state(split: int) -> None:
    x = torch.randn(2, 3, 200, 8)
    whole, whole_final = chunk_exp_filter(x, LOG_DECAY, chunk_size=64)
    head, head_final = chunk_exp_filter(x[:, :, :split], LOG_DECAY, chunk_size=64)
    tail, tail_final = chunk_exp_filter(x[:, :, split:], LOG_DECAY, head_final, chunk_size=64)
    assert relative_rms_error(torch.cat([head, tail], dim=2)[:, :, 1:], whole[:, :, 1:]) < TOLERANCE
    assert relative_rms_error(tail_final, whole_final) < TOLERANCE


def test_strong_decays_and_long_chunks_stay_finite() -> None:
    """Powers are masked before exp: nothing overflows, states underflow cleanly to 0."""
    log_decay = torch.tensor([-5.0, -50.0, -1e-6])
    x, initial = torch.randn(1, 3, 3000, 4), torch.randn(1, 3, 4)
    y, final = chunk_exp_filter(x, log_decay, initial, chunk_size=512)
    assert torch.isfinite(y).all() and torch.isfinite(final).all()
    reference, reference_final = parallel_exp_filter(x, log_decay, initial)
    assert relative_rms_error(final, reference_final) < TOLERANCE


def test_unknown_form_is_refused() -> None:
    with pytest.raises(ValueError, match="form='fast' is unknown"):
        exp_filter(torch.zeros(1, 1, 2, 1), LOG_DECAY[:1], context=ForwardContext("fast"))


def test_the_chunk_forms_carry_stays_fp32_under_autocast() -> None:
    """Under bf16 autocast the carry across chunks (an einsum of fp32 states) runs in fp32, as it
    does for a bf16 model without autocast: the two give the same outputs and state, bit for bit
    (autocast ran the carry in bf16 before)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 317, 8, generator=generator).to(torch.bfloat16)
    initial = torch.randn(2, 3, 8, generator=generator)
    plain = chunk_exp_filter(x, LOG_DECAY, initial, chunk_size=16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = chunk_exp_filter(x, LOG_DECAY, initial, chunk_size=16)
    assert autocast[1].dtype == torch.float32
    assert torch.equal(autocast[0], plain[0]) and torch.equal(autocast[1], plain[1])


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_documents_apart_are_each_filtered_alone(chunk_size: int) -> None:
    """``starts``: row 0 packs documents of lengths 1, 2, 63, 64, 65, 22 (one starting at each
    chunk edge and inside chunks), row 1 one document continuing the initial state then one of
    its own. Every form gives each document its output alone (the initial state only the first
    document of a row that does not start one) and the last document's final state."""
    lengths = [[1, 2, 63, 64, 65, 22], [100, 117]]
    length = 217
    x = torch.randn(2, 3, length, 4, dtype=torch.float64)
    initial = torch.randn(2, 3, 4, dtype=torch.float64)
    starts = torch.zeros(2, length, dtype=torch.bool)
    for row, parts in enumerate(lengths):
        starts[row, torch.tensor([0, *parts[:-1]]).cumsum(0)] = True
    starts[1, 0] = False  # row 1's first document goes on from the initial state
    forms = {"parallel": parallel_exp_filter, "recurrent": recurrent_exp_filter,
             "chunk": lambda *arguments: chunk_exp_filter(*arguments[:3], chunk_size, arguments[3])}
    for row, parts in enumerate(lengths):
        pieces, state, offset = [], None, 0
        for number, part in enumerate(parts):
            carried = initial[row:row + 1] if number == 0 and not starts[row, 0] else None
            piece, state = parallel_exp_filter(x[row:row + 1, :, offset:offset + part], LOG_DECAY, carried)
            pieces.append(piece)
            offset += part
        for name, form in forms.items():
            y, final = form(x, LOG_DECAY, initial, starts)
            assert relative_rms_error(y[row:row + 1], torch.cat(pieces, dim=2)) < TOLERANCE, (name, row)
            assert relative_rms_error(final[row:row + 1], state) < TOLERANCE, (name, row)
