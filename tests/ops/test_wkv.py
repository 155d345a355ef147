"""RWKV-4's WKV op: its parallel, chunkwise and recurrent forms are one function (outputs,
final states and gradients w.r.t. w, u, k, v and the initial state), equal to a float64
direct sum for keys as large as +-60, and finite where e^k would overflow fp32."""

from __future__ import annotations

import pytest
import torch

from helpers.documents import each_alone, packed_starts
from helpers.models import relative_rms_error
from mcsd.ops.context import ForwardContext
from mcsd.ops.wkv import EMPTY_LOG_SCALE, FORMS, empty_wkv_state, wkv
from mcsd.ops.wkv import chunk as wkv_chunk

LENGTHS = [1, 2, 63, 64, 65, 150]
CHUNK_SIZES = [1, 16, 64, 100]
TOLERANCE = 1e-5


def inputs(length: int, key_scale: float = 1.0, dtype: torch.dtype = torch.float32, seed: int = 0):
    """RWKV-4-like parameters (w = exp(time_decay) with time_decay in [-5, 3]), keys of the
    given scale and a non-empty initial state."""
    generator = torch.Generator().manual_seed(seed)
    channels = 5
    w = torch.exp(torch.linspace(-5.0, 3.0, channels, dtype=dtype))
    u = torch.randn(channels, generator=generator, dtype=dtype)
    k = torch.randn(2, length, channels, generator=generator, dtype=dtype) * key_scale
    v = torch.randn(2, length, channels, generator=generator, dtype=dtype)
    initial = torch.stack([torch.randn(2, channels, generator=generator, dtype=dtype),
                           torch.rand(2, channels, generator=generator, dtype=dtype) + 0.5,
                           torch.randn(2, channels, generator=generator, dtype=dtype)], dim=1)
    return w, u, k, v, initial


def direct_sum(w, u, k, v, initial):
    """The definition, term by term in float64 with no max trick: the carried state's
    numerator e^{p0} a0 and denominator e^{p0} b0 decay by e^{-w} per token."""
    w, u, k, v, initial = (tensor.double() for tensor in (w, u, k, v, initial))
    carried_a, carried_b = torch.exp(initial[:, 2]) * initial[:, 0], torch.exp(initial[:, 2]) * initial[:, 1]
    outputs = []
    for t in range(k.shape[1]):
        numerator = torch.exp(-t * w) * carried_a + torch.exp(u + k[:, t]) * v[:, t]
        denominator = torch.exp(-t * w) * carried_b + torch.exp(u + k[:, t])
        for i in range(t):
            weight = torch.exp(-(t - 1 - i) * w + k[:, i])
            numerator, denominator = numerator + weight * v[:, i], denominator + weight
        outputs.append(numerator / denominator)
    return torch.stack(outputs, dim=1)


def state_as_sums(state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The state's unscaled numerator and denominator (e^p a, e^p b), in float64."""
    state = state.double()
    return torch.exp(state[:, 2]) * state[:, 0], torch.exp(state[:, 2]) * state[:, 1]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("key_scale", [1.0, 20.0])
def test_every_form_is_the_direct_sum_for_keys_up_to_60(form: str, key_scale: float) -> None:
    w, u, k, v, initial = inputs(40, key_scale, dtype=torch.float64)
    k = k.clamp(-60, 60)
    assert k.abs().max() == 60 or key_scale == 1.0
    output, final = wkv(w, u, k, v, initial, context=ForwardContext(form, chunk_size=16))
    assert relative_rms_error(output, direct_sum(w, u, k, v, initial)) < 1e-12
    # The final state is what the next token reads: the direct sum continued by one token.
    next_k, next_v = torch.full_like(k[:, :1], -3.0), torch.zeros_like(v[:, :1])
    extended = direct_sum(w, u, torch.cat([k, next_k], 1), torch.cat([v, next_v], 1), initial)[:, -1]
    numerator, denominator = state_as_sums(final)
    bonus = torch.exp(u - 3.0)
    assert torch.allclose(numerator / (denominator + bonus), extended, rtol=1e-12, atol=0)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_chunk_and_recurrent_forms_equal_the_parallel_form(length: int, chunk_size: int) -> None:
    w, u, k, v, initial = inputs(length, key_scale=3.0)
    reference, reference_final = wkv(w, u, k, v, initial, context=ForwardContext("parallel"))
    for form in ("chunk", "recurrent"):
        output, final = wkv(w, u, k, v, initial, context=ForwardContext(form, chunk_size=chunk_size))
        assert output.dtype == torch.float32 and final.dtype == torch.float32
        assert relative_rms_error(output, reference) < TOLERANCE, form
        assert relative_rms_error(final[:, 2], reference_final[:, 2]) < TOLERANCE, form
        assert relative_rms_error(final[:, :2], reference_final[:, :2]) < TOLERANCE, form


@pytest.mark.parametrize("form", FORMS)
def test_fp32_is_finite_where_exp_of_the_key_overflows(form: str) -> None:
    w, u, k, v, initial = inputs(70, key_scale=1.0, dtype=torch.float64)
    k[:, 10], k[:, 40] = 95.0, -95.0  # e^95 overflows fp32 (max ~ e^88.7)
    expected = direct_sum(w, u, k, v, initial)
    output, final = wkv(w.float(), u.float(), k.float(), v.float(), initial.float(),
            context=ForwardContext(form, chunk_size=16))
    assert torch.isfinite(output).all() and torch.isfinite(final).all()
    assert relative_rms_error(output.double(), expected) < 1e-5


def test_empty_state_is_no_state_and_splitting_continues_exactly() -> None:
    w, u, k, v, _ = inputs(50)
    empty = empty_wkv_state(2, 5, k.device, torch.float32)
    assert (empty[:, 2] == EMPTY_LOG_SCALE).all() and (empty[:, :2] == 0).all()
    whole, whole_final = wkv(w, u, k, v, None, context=ForwardContext("parallel"))
    assert torch.equal(whole, wkv(w, u, k, v, empty, context=ForwardContext("parallel"))[0])
    for form in FORMS:
        head, state = wkv(w, u, k[:, :23], v[:, :23], None, context=ForwardContext(form, chunk_size=8))
        tail, final = wkv(w, u, k[:, 23:], v[:, 23:], state, context=ForwardContext(form, chunk_size=8))
        assert relative_rms_error(torch.cat([head, tail], 1), whole) < TOLERANCE, form
        assert relative_rms_error(torch.stack(state_as_sums(final)), torch.stack(state_as_sums(whole_final))) < TOLERANCE


def scale_invariant_loss(output: torch.Tensor, final: torch.Tensor, w, u) -> torch.Tensor:
    """A loss of the outputs and of what the final state means (a next token read through it):
    the state's (a, b, p) are defined up to a common rescaling, so only this is compared."""
    probe_k = torch.linspace(-1.0, 1.0, final.shape[-1])
    probe_v = torch.ones_like(probe_k)
    following = wkv(w, u, probe_k.expand(final.shape[0], 1, -1), probe_v.expand(final.shape[0], 1, -1) * 0.5,
                    final, context=ForwardContext("recurrent"))[0]
    weights = torch.linspace(0.5, 1.5, output.numel()).reshape(output.shape)
    return (output * weights).sum() + 3 * following.square().sum()


def test_gradients_agree_between_forms() -> None:
    w, u, k, v, initial = inputs(37, key_scale=3.0)
    gradients = {}
    for form in FORMS:
        leaves = [tensor.clone().requires_grad_() for tensor in (w, u, k, v, initial)]
        output, final = wkv(*leaves, context=ForwardContext(form, chunk_size=8))
        scale_invariant_loss(output, final, leaves[0], leaves[1]).backward()
        gradients[form] = [leaf.grad for leaf in leaves]
    for form in ("chunk", "recurrent"):
        for name, got, expected in zip("w u k v state".split(), gradients[form], gradients["parallel"]):
            assert torch.isfinite(got).all() and relative_rms_error(got, expected) < 1e-4, (form, name)


def looped_chunks(w, u, k, v, initial, chunk_size):
    """The chunkwise form as it was first written: the parallel form chunk by chunk, each
    started from the state the one before it returned (a Python loop over chunks)."""
    state, outputs = initial, []
    for start in range(0, k.shape[1], chunk_size):
        output, state = wkv(w, u, k[:, start:start + chunk_size], v[:, start:start + chunk_size], state,
                            context=ForwardContext("parallel"))
        outputs.append(output)
    return torch.cat(outputs, dim=1), state


@pytest.mark.parametrize("group_chunks", [2, 32])
@pytest.mark.parametrize("length", [5, 48, 50])
def test_loop_free_chunk_carry_equals_the_looped_one(group_chunks: int, length: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs, final states and every gradient, in float64, to round-off, at lengths that are
    (48) and are not (5, 50) multiples of the chunk (4), with the carry in one group of chunks
    and across several (groups of 2: both levels of the carry, and empty chunks in front; groups
    of 32, or 5 tokens in groups of 2: the one level of at most GROUP_CHUNKS chunks)."""
    monkeypatch.setattr(wkv_chunk, "GROUP_CHUNKS", group_chunks)
    results = []
    for form in (wkv_chunk.chunk_wkv, looped_chunks):
        leaves = [tensor.requires_grad_() for tensor in inputs(length, key_scale=3.0, dtype=torch.float64)]
        output, final = form(*leaves, chunk_size=4)
        scale_invariant_loss(output, final, leaves[0], leaves[1]).backward()
        results.append([output, *state_as_sums(final)] + [leaf.grad for leaf in leaves])
    for loop_free, looped in zip(*results):
        torch.testing.assert_close(loop_free, looped, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", FORMS)
def test_gradcheck(form: str) -> None:
    w, u, k, v, initial = inputs(6, key_scale=2.0, dtype=torch.float64)
    leaves = [tensor.requires_grad_() for tensor in (w, u, k, v)]
    initial = initial.requires_grad_()
    torch.autograd.gradcheck(lambda *args: wkv(*args,
            context=ForwardContext(form, chunk_size=4))[0], (*leaves, initial))


def test_unknown_form_is_refused() -> None:
    w, u, k, v, _ = inputs(3)
    with pytest.raises(ValueError, match="form='chunked' is unknown: use one of parallel, chunk, recurrent"):
        wkv(w, u, k, v, context=ForwardContext("chunked"))
    with pytest.raises(ValueError, match="chunk_size=0"):
        wkv(w, u, k, v, context=ForwardContext("chunk", chunk_size=0))


@pytest.mark.parametrize("group_chunks", [2, 32])
@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_documents_apart_are_each_read_alone(chunk_size: int, group_chunks: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``starts`` (tests/helpers/documents.py): every form gives each document its wkv alone (the
    initial state only the first document of a row that does not start one) and the last
    document's final state; the token before a start is never read. The chunk form's carry in
    groups of 2 chunks and of 32 (one level, or two with documents starting inside groups and
    running across them)."""
    monkeypatch.setattr(wkv_chunk, "GROUP_CHUNKS", group_chunks)
    starts = packed_starts()
    batch, length, channels = starts.shape[0], starts.shape[1], 4
    w, u = torch.rand(channels, dtype=torch.float64) + 0.1, torch.randn(channels, dtype=torch.float64)
    k, v = torch.randn(batch, length, channels, dtype=torch.float64), torch.randn(batch, length, channels, dtype=torch.float64)
    initial = wkv(w, u, torch.randn(batch, 5, channels, dtype=torch.float64),
                  torch.randn(batch, 5, channels, dtype=torch.float64), context=ForwardContext("parallel"))[1]

    def alone(row: int, tokens: slice, carried: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return wkv(w, u, k[row:row + 1, tokens], v[row:row + 1, tokens], initial[row:row + 1] if carried else None,
                   context=ForwardContext("parallel"))

    for form in FORMS:
        output, final = wkv(w, u, k, v, initial, context=ForwardContext(form, chunk_size=chunk_size, starts=starts))
        for row in range(batch):
            expected, state = each_alone(alone, row, axis=1)
            assert relative_rms_error(output[row:row + 1], expected) < TOLERANCE, (form, row)
            assert relative_rms_error(final[row:row + 1, :2] * final[row:row + 1, 2:].exp(),
                                      state[:, :2] * state[:, 2:].exp()) < TOLERANCE, (form, row)
