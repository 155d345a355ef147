"""The gated delta rule (:mod:`mcsd.ops.delta_rule`): its recurrent form is the written update,
its three forms and the step are one function (outputs, final states, gradients, initial states,
documents apart), DeltaNet is its case without decay, and a token written with ``beta = 1``
is read back exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.documents import each_alone, packed_starts
from helpers.models import relative_rms_error
from mcsd.ops.common import FORMS
from mcsd.ops.context import ForwardContext
from mcsd.ops.delta_rule import chunk_delta_rule, delta_rule, delta_rule_step, recurrent_delta_rule

LENGTHS = [1, 2, 63, 64, 65, 150]
CHUNK_SIZES = [1, 16, 64, 100]
TOLERANCE = 1e-5


def inputs(length: int, dtype: torch.dtype = torch.float32, seed: int = 0, batch: int = 2):
    """As the mixer hands them: L2-normalised keys, beta in (0, 1), log-decays <= 0."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 3, length, 4, generator=generator, dtype=dtype)
    k = F.normalize(torch.randn(batch, 3, length, 4, generator=generator, dtype=dtype), dim=-1)
    v = torch.randn(batch, 3, length, 6, generator=generator, dtype=dtype)
    beta = torch.rand(batch, 3, length, generator=generator, dtype=dtype)
    log_decay = -torch.rand(batch, 3, length, generator=generator, dtype=dtype) * 0.3
    initial = torch.randn(batch, 3, 4, 6, generator=generator, dtype=dtype)
    return q, k, v, beta, log_decay, initial


def literal(q, k, v, beta, log_decay, initial):
    """S_t = a_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T (values by keys, the paper's way
    round), o_t = S_t q_t: a plain loop in float64."""
    q, k, v, beta, g = (tensor.double() for tensor in (q, k, v, beta, log_decay))
    state = initial.double().transpose(-1, -2)  # [B, H, Dv, Dk]
    eye = torch.eye(k.shape[-1], dtype=torch.float64)
    outputs = []
    for t in range(q.shape[2]):
        kt, bt = k[:, :, t], beta[:, :, t, None, None]
        state = (torch.exp(g[:, :, t])[..., None, None] * state @ (eye - bt * kt[..., :, None] * kt[..., None, :])
                 + bt * v[:, :, t, :, None] * kt[..., None, :])
        outputs.append(torch.einsum("bhvk,bhk->bhv", state, q[:, :, t]))
    return torch.stack(outputs, dim=2), state.transpose(-1, -2)


def test_recurrent_form_is_the_papers_update() -> None:
    q, k, v, beta, log_decay, initial = inputs(9)
    output, final = recurrent_delta_rule(q, k, v, beta, log_decay, initial)
    expected_output, expected_final = literal(q, k, v, beta, log_decay, initial)
    assert relative_rms_error(output, expected_output) < 1e-6 and relative_rms_error(final, expected_final) < 1e-6
    assert final.dtype == torch.float32 and output.dtype == v.dtype


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("with_initial_state", [False, True])
def test_forms_agree(length: int, with_initial_state: bool) -> None:
    q, k, v, beta, log_decay, initial = inputs(length)
    initial = initial if with_initial_state else None
    reference, reference_final = delta_rule(q, k, v, beta, log_decay, initial, context=ForwardContext("recurrent"))
    parallel, parallel_final = delta_rule(q, k, v, beta, log_decay, initial, context=ForwardContext("parallel"))
    assert relative_rms_error(parallel, reference) < TOLERANCE
    assert relative_rms_error(parallel_final, reference_final) < TOLERANCE
    for chunk_size in CHUNK_SIZES:
        chunked, chunked_final = delta_rule(q, k, v, beta, log_decay, initial,
                                            context=ForwardContext("chunk", chunk_size=chunk_size))
        assert relative_rms_error(chunked, reference) < TOLERANCE, chunk_size
        assert relative_rms_error(chunked_final, reference_final) < TOLERANCE, chunk_size


def test_gradients_agree() -> None:
    """Gradients w.r.t. q, k, v, beta, the log-decays and the initial state."""
    gradients = {}
    for form in FORMS:
        leaves = [tensor.clone().requires_grad_() for tensor in inputs(70)]
        output, final = delta_rule(*leaves, context=ForwardContext(form, chunk_size=16))
        generator = torch.Generator().manual_seed(1)
        weights = torch.randn(output.shape, generator=generator), torch.randn(final.shape, generator=generator)
        ((output * weights[0]).sum() + (final * weights[1]).sum()).backward()
        gradients[form] = [leaf.grad for leaf in leaves]
    for form in ("parallel", "chunk"):
        for expected, actual in zip(gradients["recurrent"], gradients[form], strict=True):
            assert relative_rms_error(actual, expected) < 1e-4, form


def test_chunk_form_passes_gradcheck() -> None:
    leaves = [tensor.requires_grad_() for tensor in inputs(11, torch.float64, batch=1)]
    assert torch.autograd.gradcheck(lambda *a: chunk_delta_rule(*a, chunk_size=4), leaves)


def test_without_decay_it_is_deltanets_rule_and_a_full_write_is_read_back() -> None:
    """``g = 0``: DeltaNet's ``S_t = S_{t-1} (I - b k k^T) + b v k^T``; with ``beta = 1`` the key
    just written reads back its value exactly (the delta rule's point: it replaces, not adds)."""
    q, k, v, beta, _, initial = inputs(30, torch.float64)
    no_decay = torch.zeros_like(beta)
    for form in FORMS:
        got = delta_rule(q, k, v, beta, no_decay, initial, context=ForwardContext(form, chunk_size=8))
        for actual, want in zip(got, literal(q, k, v, beta, no_decay, initial), strict=True):
            torch.testing.assert_close(actual, want, rtol=1e-10, atol=1e-10)
    _, state = delta_rule(q[:, :, :10], k[:, :, :10], v[:, :, :10], torch.ones_like(beta[:, :, :10]),
                          no_decay[:, :, :10], initial)
    read = torch.einsum("bhk,bhkv->bhv", k[:, :, 9], state)
    torch.testing.assert_close(read, v[:, :, 9], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("split", [1, 37, 64])
def test_split_sequence_and_the_step_continue_from_the_final_state(split: int) -> None:
    q, k, v, beta, log_decay, _ = inputs(100)
    parts = (q, k, v, beta, log_decay)
    whole, whole_final = delta_rule(*parts)
    first, state = delta_rule(*(x[:, :, :split] for x in parts))
    second, final = delta_rule(*(x[:, :, split:] for x in parts), state)
    assert relative_rms_error(torch.cat([first, second], dim=2), whole) < TOLERANCE
    assert relative_rms_error(final, whole_final) < TOLERANCE
    step_output, step_state = delta_rule_step(*(x[:, :, split] for x in parts), state)
    _, after_one = delta_rule(*(x[:, :, :split + 1] for x in parts))
    assert relative_rms_error(step_output, second[:, :, 0]) < TOLERANCE
    assert relative_rms_error(step_state, after_one) < TOLERANCE


@pytest.mark.parametrize("chunk_size", [16, 64])
def test_documents_apart_equal_each_document_alone(chunk_size: int) -> None:
    starts = packed_starts()
    batch, length = starts.shape
    q, k, v, beta, log_decay, initial = inputs(length, torch.float64, batch=batch)
    parts = (q, k, v, beta, log_decay)

    def alone(row: int, tokens: slice, carried: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return delta_rule(*(x[row:row + 1, :, tokens] for x in parts), initial[row:row + 1] if carried else None,
                          context=ForwardContext("recurrent"))

    for form in FORMS:
        output, final = delta_rule(*parts, initial, context=ForwardContext(form, chunk_size=chunk_size, starts=starts))
        for row in range(batch):
            expected, state = each_alone(alone, row, axis=2)
            assert relative_rms_error(output[row:row + 1], expected) < TOLERANCE, (form, row)
            assert relative_rms_error(final[row:row + 1], state) < TOLERANCE, (form, row)


def test_the_chunk_form_compiles_once_for_every_length() -> None:
    """Traced with the length a symbol (dynamo's dynamic shapes), the chunk form is one graph for
    every length: its carry over the chunks is one op (``mcsd::delta_rule_carry``, with its own
    backward), whose outputs, final states and gradients are the eager ones."""
    torch._dynamo.reset()
    context = ForwardContext("chunk", chunk_size=16)
    traced = torch.compile(lambda *a: delta_rule(*a, context=context), backend="eager", dynamic=True)
    for length in (40, 57):
        parts = inputs(length)
        leaves = [tensor.clone().requires_grad_() for tensor in parts]
        with torch.compiler.set_stance("fail_on_recompile" if length == 57 else "default"):
            output, final = traced(*leaves)
        (output.square().sum() + final.square().sum()).backward()
        expected, expected_final = recurrent_delta_rule(*(tensor.double() for tensor in parts))
        assert relative_rms_error(output, expected) < TOLERANCE and relative_rms_error(final, expected_final) < TOLERANCE
        eager_leaves = [tensor.clone().requires_grad_() for tensor in parts]
        expected, expected_final = delta_rule(*eager_leaves, context=context)
        (expected.square().sum() + expected_final.square().sum()).backward()
        for leaf, eager in zip(leaves, eager_leaves, strict=True):
            assert relative_rms_error(leaf.grad, eager.grad) < 1e-4, length


def test_a_gradient_of_the_final_state_alone() -> None:
    """The carry's backward with no gradient from the outputs (autograd hands it zeros): the
    recurrent form's gradients, and none (zeros) for the queries, which the state never reads."""
    gradients = []
    for form in ("chunk", "recurrent"):
        leaves = [tensor.clone().requires_grad_() for tensor in inputs(50)]
        delta_rule(*leaves, context=ForwardContext(form, chunk_size=16))[1].square().sum().backward()
        gradients.append([leaf.grad for leaf in leaves])
    (query, *actual), (no_query, *expected) = gradients
    assert no_query is None and torch.count_nonzero(query) == 0
    for got, want in zip(actual, expected, strict=True):
        assert relative_rms_error(got, want) < 1e-4


def test_the_carry_op_passes_opcheck() -> None:
    """The carry's schema, fake tensors and autograd registration, as torch.library checks them."""
    from mcsd.ops.delta_rule.chunk import _carry

    generator = torch.Generator().manual_seed(0)
    shapes = [(1, 2, 3, 4, 5), (1, 2, 3, 4, 6), (1, 2, 3, 4, 6), (1, 2, 3, 4, 4), (1, 2, 3, 4, 6), (1, 2, 3), (1, 2, 6, 5)]
    args = [torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True) for shape in shapes]
    torch.library.opcheck(_carry, args)


def test_the_parallel_form_exports_one_graph_for_every_length() -> None:
    """``torch.export`` with the length a symbol (as the ONNX prefill traces it): the system of
    symbolic size is solved by forward substitution in a ``scan`` (ONNX has no triangular solve),
    and the exported graph gives the eager outputs and states at other lengths."""

    class Parallel(torch.nn.Module):
        def forward(self, q, k, v, beta, log_decay, initial):
            return delta_rule(q, k, v, beta, log_decay, initial, context=ForwardContext("parallel"))

    length = torch.export.Dim("length", min=2, max=512)
    program = torch.export.export(Parallel(), inputs(20), dynamic_shapes=({2: length},) * 5 + (None,))
    assert "scan" in str(program.graph) and "solve_triangular" not in str(program.graph)
    for size in (7, 33):
        parts = inputs(size, seed=size)
        for actual, expected in zip(program.module()(*parts), recurrent_delta_rule(*parts), strict=True):
            assert relative_rms_error(actual, expected) < TOLERANCE, size
