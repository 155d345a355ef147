"""Gated linear attention (:mod:`mcsd.ops.gla`): its parallel form is the written recurrence, its
three forms and the step are one function (outputs, final states, gradients, initial states,
documents apart), equal channels make it decayed attention with a per-token decay, and strong
decays at long lengths stay finite."""

from __future__ import annotations

import pytest
import torch

from helpers.documents import each_alone, packed_starts
from helpers.models import relative_rms_error
from mcsd.ops.common import FORMS
from mcsd.ops.context import ForwardContext
from mcsd.ops.decayed_attention import decayed_attention
from mcsd.ops.gla import chunk_gla, gla, gla_step, key_segment_log_decays, parallel_gla
from mcsd.ops.gla.chunk import intra_chunk_scores

LENGTHS = [1, 2, 63, 64, 65, 150]
CHUNK_SIZES = [1, 16, 64, 100]
TOLERANCE = 1e-5


def inputs(length: int, dtype: torch.dtype = torch.float32, seed: int = 0, batch: int = 2):
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, 3, length, 4, generator=generator, dtype=dtype) for _ in range(2))
    v = torch.randn(batch, 3, length, 6, generator=generator, dtype=dtype)
    log_decay = -torch.rand(batch, 3, length, 4, generator=generator, dtype=dtype) * 0.5
    initial = torch.randn(batch, 3, 4, 6, generator=generator, dtype=dtype)
    return q, k, v, log_decay, initial


def literal(q, k, v, log_decay, initial):
    """S_n = diag(exp(g_n)) S_{n-1} + k_n^T v_n, o_n = q_n S_n, as a plain loop in float64."""
    q, k, v, g, state = (tensor.double() for tensor in (q, k, v, log_decay, initial))
    outputs = []
    for n in range(q.shape[2]):
        state = torch.exp(g[:, :, n])[..., None] * state + k[:, :, n, :, None] * v[:, :, n, None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, n], state))
    return torch.stack(outputs, dim=2), state


def test_parallel_form_is_the_written_recurrence() -> None:
    q, k, v, log_decay, initial = inputs(9)
    output, final = parallel_gla(q, k, v, log_decay, initial)
    expected_output, expected_final = literal(q, k, v, log_decay, initial)
    assert relative_rms_error(output, expected_output) < 1e-6 and relative_rms_error(final, expected_final) < 1e-6
    assert final.dtype == torch.float32 and output.dtype == v.dtype


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("with_initial_state", [False, True])
def test_forms_agree(length: int, with_initial_state: bool) -> None:
    q, k, v, log_decay, initial = inputs(length)
    initial = initial if with_initial_state else None
    reference, reference_final = gla(q, k, v, log_decay, initial, context=ForwardContext("parallel"))
    recurrent, recurrent_final = gla(q, k, v, log_decay, initial, context=ForwardContext("recurrent"))
    assert relative_rms_error(recurrent, reference) < TOLERANCE
    assert relative_rms_error(recurrent_final, reference_final) < TOLERANCE
    for chunk_size in CHUNK_SIZES:
        chunked, chunked_final = gla(q, k, v, log_decay, initial, context=ForwardContext("chunk", chunk_size=chunk_size))
        assert relative_rms_error(chunked, reference) < TOLERANCE, chunk_size
        assert relative_rms_error(chunked_final, reference_final) < TOLERANCE, chunk_size


def test_gradients_agree() -> None:
    """Gradients w.r.t. q, k, v, the log-decays and the initial state."""
    gradients = {}
    for form in FORMS:
        leaves = [tensor.clone().requires_grad_() for tensor in inputs(70)]
        output, final = gla(*leaves, context=ForwardContext(form, chunk_size=16))
        generator = torch.Generator().manual_seed(1)
        weights = torch.randn(output.shape, generator=generator), torch.randn(final.shape, generator=generator)
        ((output * weights[0]).sum() + (final * weights[1]).sum()).backward()
        gradients[form] = [leaf.grad for leaf in leaves]
    for form in ("chunk", "recurrent"):
        for expected, actual in zip(gradients["parallel"], gradients[form], strict=True):
            assert relative_rms_error(actual, expected) < 1e-4, form


@pytest.mark.parametrize("chunk_size", [4, 16])
def test_chunk_form_passes_gradcheck(chunk_size: int) -> None:
    """16: two sub-chunks per chunk, the scores across them through the scaled-key matmul."""
    leaves = [tensor.requires_grad_() for tensor in inputs(20, torch.float64, batch=1)]
    assert torch.autograd.gradcheck(lambda *a: chunk_gla(*a, chunk_size=chunk_size), leaves)


@pytest.mark.parametrize("sub_chunk", [1, 3, 8, 24])
def test_sub_chunked_scores_are_the_chunk_parallel_form(sub_chunk: int) -> None:
    """The scores and decays to the chunk's end of :func:`intra_chunk_scores` (sub-chunks of
    gcd(24, sub_chunk)) equal the ``[L, L, Dk]`` decays of the parallel form, -inf log-decays (a
    document's start) and decays of -200 a token included, to fp64 round-off."""
    q, k, _, log_decay, _ = inputs(24, torch.float64)
    log_decay[0, :, 9] = float("-inf")
    log_decay[1, 0, 5:7] = -200.0
    decay = torch.exp(key_segment_log_decays(log_decay))
    expected_scores = torch.einsum("bhnd,bhmd,bhnmd->bhnm", q, k, decay)
    scores, to_end = intra_chunk_scores(q, k, log_decay, sub_chunk)
    torch.testing.assert_close(scores, expected_scores, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(to_end, decay[..., -1, :, :], rtol=1e-12, atol=1e-12)


def test_equal_channels_are_decayed_attention_with_a_per_token_decay() -> None:
    """One decay for every key channel of a head is :mod:`mcsd.ops.decayed_attention`'s per-token
    case (the SSD's), in each form, to fp64 round-off."""
    q, k, v, log_decay, initial = inputs(40, torch.float64)
    per_token = log_decay[..., 0]
    for form in FORMS:
        context = ForwardContext(form, chunk_size=16)
        got = gla(q, k, v, per_token[..., None].expand_as(log_decay), initial, context=context)
        expected = decayed_attention(q, k, v, per_token, initial, context=context)
        for actual, want in zip(got, expected, strict=True):
            torch.testing.assert_close(actual, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("split", [1, 37, 64])
def test_split_sequence_and_the_step_continue_from_the_final_state(split: int) -> None:
    q, k, v, log_decay, _ = inputs(100)
    whole, whole_final = gla(q, k, v, log_decay)
    first, state = gla(q[:, :, :split], k[:, :, :split], v[:, :, :split], log_decay[:, :, :split])
    second, final = gla(q[:, :, split:], k[:, :, split:], v[:, :, split:], log_decay[:, :, split:], state)
    assert relative_rms_error(torch.cat([first, second], dim=2), whole) < TOLERANCE
    assert relative_rms_error(final, whole_final) < TOLERANCE
    step_output, step_state = gla_step(q[:, :, split], k[:, :, split], v[:, :, split], log_decay[:, :, split], state)
    _, after_one = gla(q[:, :, :split + 1], k[:, :, :split + 1], v[:, :, :split + 1], log_decay[:, :, :split + 1])
    assert relative_rms_error(step_output, second[:, :, 0]) < TOLERANCE
    assert relative_rms_error(step_state, after_one) < TOLERANCE


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_documents_apart_equal_each_document_alone(chunk_size: int) -> None:
    """Outputs and final states of a packed batch (``starts``) equal each document run alone, in
    every form (row 1's first document goes on from the initial state)."""
    starts = packed_starts()
    batch, length = starts.shape
    q, k, v, log_decay, initial = inputs(length, torch.float64, batch=batch)

    def alone(row: int, tokens: slice, carried: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return gla(q[row:row + 1, :, tokens], k[row:row + 1, :, tokens], v[row:row + 1, :, tokens],
                   log_decay[row:row + 1, :, tokens], initial[row:row + 1] if carried else None,
                   context=ForwardContext("parallel"))

    for form in FORMS:
        output, final = gla(q, k, v, log_decay, initial, context=ForwardContext(form, chunk_size=chunk_size,
                                                                                starts=starts))
        for row in range(batch):
            expected, state = each_alone(alone, row, axis=2)
            assert relative_rms_error(output[row:row + 1], expected) < TOLERANCE, (form, row)
            assert relative_rms_error(final[row:row + 1], state) < TOLERANCE, (form, row)


def test_strong_decays_at_long_lengths_stay_finite() -> None:
    """Cumulative log-decays of -2400 over 600 tokens: every power is a masked sum before exp."""
    q, k, v, _, initial = inputs(600, batch=1)
    log_decay = torch.full((1, 3, 600, 4), -4.0)
    for form in ("parallel", "chunk"):
        output, final = gla(q, k, v, log_decay, initial, context=ForwardContext(form))
        assert torch.isfinite(output).all() and torch.isfinite(final).all()
