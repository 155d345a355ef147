"""Decayed linear attention: its parallel, chunkwise and recurrent forms are one function
(outputs, final states and gradients, with constant-per-head and per-token decays), and
MCSD's exponential filter is its special case."""

from __future__ import annotations

import pytest
import torch

from helpers.documents import each_alone, packed_starts
from helpers.models import relative_rms_error
from mcsd.ops.context import ForwardContext
from mcsd.ops.common import FORMS
from mcsd.ops.decayed_attention import (
    chunk_decayed_attention,
    decayed_attention,
    decayed_attention_step,
    parallel_decayed_attention,
    segment_log_decays,
)
from mcsd.ops.exp_filter import exp_filter

LENGTHS = [1, 2, 63, 64, 65, 200]
CHUNK_SIZES = [1, 16, 64, 100]
HEAD_LOG_DECAY = torch.log1p(-(2.0 ** -torch.arange(5.0, 8.0)))  # RetNet's gammas for 3 heads
TOLERANCE = 1e-5


def inputs(length: int, per_token: bool, dtype: torch.dtype = torch.float32, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(2, 3, length, 4, generator=generator, dtype=dtype) for _ in range(2))
    v = torch.randn(2, 3, length, 6, generator=generator, dtype=dtype)
    log_decay = (-torch.rand(2, 3, length, generator=generator, dtype=dtype) * 0.5 if per_token
                 else HEAD_LOG_DECAY.to(dtype))
    initial = torch.randn(2, 3, 4, 6, generator=generator, dtype=dtype)
    return q, k, v, log_decay, initial


def literal(q, k, v, log_decay, initial):
    """S_n = exp(g_n) S_{n-1} + k_n^T v_n, o_n = q_n S_n, as a plain loop in float64."""
    q, k, v, initial = q.double(), k.double(), v.double(), initial.double()
    g = log_decay.double()
    g = g[None, :, None].expand(q.shape[0], -1, q.shape[2]) if g.dim() == 1 else g
    state, outputs = initial, []
    for n in range(q.shape[2]):
        state = torch.exp(g[:, :, n])[..., None, None] * state + k[:, :, n, :, None] * v[:, :, n, None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, n], state))
    return torch.stack(outputs, dim=2), state


@pytest.mark.parametrize("per_token", [False, True])
def test_parallel_form_is_the_written_recurrence(per_token: bool) -> None:
    q, k, v, log_decay, initial = inputs(9, per_token)
    output, final = parallel_decayed_attention(q, k, v, log_decay, initial)
    expected_output, expected_final = literal(q, k, v, log_decay, initial)
    assert relative_rms_error(output, expected_output) < 1e-6 and relative_rms_error(final, expected_final) < 1e-6
    assert final.dtype == torch.float32 and output.dtype == v.dtype


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("with_initial_state", [False, True])
@pytest.mark.parametrize("per_token", [False, True])
def test_forms_agree(length: int, with_initial_state: bool, per_token: bool) -> None:
    q, k, v, log_decay, initial = inputs(length, per_token)
    initial = initial if with_initial_state else None
    reference, reference_final = decayed_attention(q, k, v, log_decay, initial, context=ForwardContext("parallel"))
    recurrent, recurrent_final = decayed_attention(q, k, v, log_decay, initial, context=ForwardContext("recurrent"))
    assert relative_rms_error(recurrent, reference) < TOLERANCE
    assert relative_rms_error(recurrent_final, reference_final) < TOLERANCE
    for chunk_size in CHUNK_SIZES:
        chunked, chunked_final = decayed_attention(q, k, v, log_decay, initial,
                context=ForwardContext("chunk", chunk_size=chunk_size))
        assert relative_rms_error(chunked, reference) < TOLERANCE, chunk_size
        assert relative_rms_error(chunked_final, reference_final) < TOLERANCE, chunk_size


@pytest.mark.parametrize("per_token", [False, True])
def test_gradients_agree(per_token: bool) -> None:
    """Gradients w.r.t. q, k, v, the initial state and (per token) the log-decays."""
    gradients = {}
    for form in ("parallel", "chunk", "recurrent"):
        leaves = [tensor.clone().requires_grad_(tensor.dim() > 1 or per_token) for tensor in inputs(70, per_token)]
        q, k, v, log_decay, initial = leaves
        output, final = decayed_attention(q, k, v, log_decay, initial, context=ForwardContext(form, chunk_size=16))
        generator = torch.Generator().manual_seed(1)
        weights = torch.randn(output.shape, generator=generator), torch.randn(final.shape, generator=generator)
        ((output * weights[0]).sum() + (final * weights[1]).sum()).backward()
        gradients[form] = [leaf.grad for leaf in leaves if leaf.requires_grad]
    assert len(gradients["parallel"]) == (5 if per_token else 4)
    for form in ("chunk", "recurrent"):
        for expected, actual in zip(gradients["parallel"], gradients[form]):
            assert relative_rms_error(actual, expected) < 1e-4, form


def looped_chunks(q, k, v, log_decay, initial, chunk_size):
    """The chunkwise form as it was first written: the parallel form chunk by chunk, each
    started from the state the one before it returned (a Python loop over chunks)."""
    log_decay = log_decay[None, :, None].expand(q.shape[0], -1, q.shape[2]) if log_decay.dim() == 1 else log_decay
    state, outputs = initial, []
    for start in range(0, q.shape[2], chunk_size):
        part = slice(start, start + chunk_size)
        output, state = parallel_decayed_attention(q[:, :, part], k[:, :, part], v[:, :, part],
                                                   log_decay[:, :, part], state)
        outputs.append(output)
    return torch.cat(outputs, dim=2), state


@pytest.mark.parametrize("length", [5, 48, 50])
@pytest.mark.parametrize("per_token", [False, True])
def test_loop_free_chunk_carry_equals_the_looped_one(length: int, per_token: bool) -> None:
    """Outputs, final states and every gradient, in float64, to round-off, at lengths that are
    (48) and are not (5, 50) multiples of the chunk (16)."""
    results = []
    for form in (chunk_decayed_attention, looped_chunks):
        leaves = [tensor.requires_grad_(tensor.dim() > 1 or per_token)
                  for tensor in inputs(length, per_token, torch.float64)]
        output, final = form(*leaves, chunk_size=16)
        generator = torch.Generator().manual_seed(1)
        weights = (torch.randn(output.shape, generator=generator, dtype=torch.float64),
                   torch.randn(final.shape, generator=generator, dtype=torch.float64))
        ((output * weights[0]).sum() + (final * weights[1]).sum()).backward()
        results.append([output, final] + [leaf.grad for leaf in leaves if leaf.requires_grad])
    for loop_free, looped in zip(*results):
        torch.testing.assert_close(loop_free, looped, rtol=1e-12, atol=1e-12)


def test_chunk_form_passes_gradcheck() -> None:
    q, k, v, log_decay, initial = (t.requires_grad_() for t in inputs(11, True, torch.float64))
    assert torch.autograd.gradcheck(lambda *a: decayed_attention(*a, context=ForwardContext("chunk", chunk_size=4)),
                                    (q, k, v, log_decay, initial))


@pytest.mark.parametrize("split", [1, 37, 64])
def test_split_sequence_continues_from_the_final_state(split: int) -> None:
    q, k, v, log_decay, _ = inputs(100, True)
    whole, whole_final = decayed_attention(q, k, v, log_decay)
    first, state = decayed_attention(q[:, :, :split], k[:, :, :split], v[:, :, :split], log_decay[:, :, :split])
    second, final = decayed_attention(q[:, :, split:], k[:, :, split:], v[:, :, split:], log_decay[:, :, split:], state)
    assert relative_rms_error(torch.cat([first, second], dim=2), whole) < TOLERANCE
    assert relative_rms_error(final, whole_final) < TOLERANCE
    step_output, step_state = decayed_attention_step(q[:, :, split], k[:, :, split], v[:, :, split],
                                                     log_decay[:, :, split], state)
    assert relative_rms_error(step_output, second[:, :, 0]) < TOLERANCE


def test_strong_decays_at_long_lengths_stay_finite() -> None:
    """Cumulative log-decays of -4000 over 4000 tokens: every power is masked before exp."""
    q, k, v, _, initial = inputs(4000, False)
    log_decay = torch.full((3,), -1.0)
    for form in ("parallel", "chunk"):
        output, final = decayed_attention(q, k, v, log_decay, initial, context=ForwardContext(form))
        assert torch.isfinite(output).all() and torch.isfinite(final).all()


def test_segment_log_decays_are_the_sums_between_positions() -> None:
    log_decay = torch.tensor([-1.0, -2.0, -4.0, -8.0])
    expected = torch.tensor([[0.0, -torch.inf, -torch.inf, -torch.inf],
                             [-2.0, 0.0, -torch.inf, -torch.inf],
                             [-6.0, -4.0, 0.0, -torch.inf],
                             [-14.0, -12.0, -8.0, 0.0]])
    assert torch.equal(segment_log_decays(log_decay), expected)
    assert segment_log_decays(log_decay[None, None].expand(2, 3, -1)).shape == (2, 3, 4, 4)


def test_parallel_form_keeps_short_segments_exact_when_cumulative_decay_is_large() -> None:
    """Per-token log-decays around -1 over 3000 tokens (|G| reaches 3000): the difference of
    two fp32 cumulative sums would be off by ~2e-4 near the diagonal (3e-5 relative RMS error in
    the output); the masked sums are not."""
    generator = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 2, 3000, 4, generator=generator) for _ in range(2))
    v = torch.randn(1, 2, 3000, 4, generator=generator)
    log_decay = -2 * torch.rand(1, 2, 3000, generator=generator)
    output, final = parallel_decayed_attention(q, k, v, log_decay)
    expected_output, expected_final = literal(q, k, v, log_decay, torch.zeros(1, 2, 4, 4))
    assert relative_rms_error(output, expected_output) < TOLERANCE
    assert relative_rms_error(final, expected_final) < TOLERANCE
    cumulative = log_decay.cumsum(-1)
    differenced = torch.exp(cumulative[..., :, None] - cumulative[..., None, :]).tril()
    exact = torch.exp(segment_log_decays(log_decay.double()))
    assert (differenced - exact).abs().max() > 100 * (torch.exp(segment_log_decays(log_decay)) - exact).abs().max()


@pytest.mark.parametrize("form", ["parallel", "chunk", "recurrent"])
def test_constant_per_token_decay_is_retention(form: str) -> None:
    """SSD's log-decay dt * A with a constant dt per head is RetNet's fixed per-head decay."""
    q, k, v, _, initial = inputs(40, False)
    per_token = HEAD_LOG_DECAY[None, :, None].expand(2, -1, 40).clone()
    assert torch.equal(decayed_attention(q, k, v, per_token, initial, context=ForwardContext(form, chunk_size=16))[0],
                       decayed_attention(q, k, v, HEAD_LOG_DECAY, initial,
                               context=ForwardContext(form, chunk_size=16))[0])


@pytest.mark.parametrize("form", ["parallel", "chunk", "recurrent"])
def test_mcsd_decay_filter_is_the_special_case(form: str) -> None:
    """Dk = 1, q = k = 1, v = x: the exp_filter (strictly causal) is retention minus the
    diagonal, and its state is the retention state decayed once more."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 50, 5, generator=generator)
    h0 = torch.randn(2, 3, 5, generator=generator)
    ones = torch.ones(2, 3, 50, 1)
    filtered, filter_final = exp_filter(x, HEAD_LOG_DECAY, HEAD_LOG_DECAY.exp()[None, :, None] * h0,
            context=ForwardContext(form, chunk_size=16))
    retained, retention_final = decayed_attention(ones, ones, x, HEAD_LOG_DECAY, h0[:, :, None, :],
            context=ForwardContext(form, chunk_size=16))
    assert relative_rms_error(filtered, retained - x) < TOLERANCE
    assert relative_rms_error(filter_final, HEAD_LOG_DECAY.exp()[None, :, None] * retention_final[:, :, 0]) < TOLERANCE


def test_unknown_form_is_refused() -> None:
    with pytest.raises(ValueError, match="form='fast' is unknown"):
        decayed_attention(*inputs(4, False)[:4], context=ForwardContext("fast"))


def test_the_chunk_forms_carries_stay_fp32_under_autocast() -> None:
    """Under bf16 autocast the products over states (chunk ends and what a chunk reads of its
    starting state) run in fp32, as they do for a bf16 model without autocast: the two give the
    same outputs and state, bit for bit (autocast ran them in bf16 before)."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 200, 8, generator=generator).to(torch.bfloat16) for _ in range(3))
    log_decay = -torch.rand(2, 2, 200, generator=generator) * 0.1
    initial = torch.randn(2, 2, 8, 8, generator=generator)
    plain = chunk_decayed_attention(q, k, v, log_decay, initial, chunk_size=32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = chunk_decayed_attention(q, k, v, log_decay, initial, chunk_size=32)
    assert autocast[1].dtype == torch.float32
    assert torch.equal(autocast[0], plain[0]) and torch.equal(autocast[1], plain[1])


@pytest.mark.parametrize("per_token", [False, True], ids=["per_head", "per_token"])
@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_documents_apart_are_each_attended_alone(chunk_size: int, per_token: bool) -> None:
    """``starts`` (tests/helpers/documents.py), with RetNet's decay per head or an SSD's per
    token: every form gives each document its output alone (the initial state only the first
    document of a row that does not start one) and the last document's final state."""
    starts = packed_starts()
    batch, length = starts.shape
    q, k = (torch.randn(batch, 3, length, 4, dtype=torch.float64) for _ in range(2))
    v = torch.randn(batch, 3, length, 5, dtype=torch.float64)
    log_decay = -torch.rand(batch, 3, length, dtype=torch.float64) if per_token else HEAD_LOG_DECAY.double()
    initial = torch.randn(batch, 3, 4, 5, dtype=torch.float64)

    def alone(row: int, tokens: slice, carried: bool) -> tuple[torch.Tensor, torch.Tensor]:
        decay = log_decay[row:row + 1, :, tokens] if per_token else log_decay
        return decayed_attention(q[row:row + 1, :, tokens], k[row:row + 1, :, tokens], v[row:row + 1, :, tokens],
                                 decay, initial[row:row + 1] if carried else None, context=ForwardContext("parallel"))

    for form in FORMS:
        output, final = decayed_attention(q, k, v, log_decay, initial,
                context=ForwardContext(form, chunk_size=chunk_size, starts=starts))
        for row in range(batch):
            expected, state = each_alone(alone, row, axis=2)
            assert relative_rms_error(output[row:row + 1], expected) < TOLERANCE, (form, row)
            assert relative_rms_error(final[row:row + 1], state) < TOLERANCE, (form, row)
