"""The forward context: documents turned into starts once, an unknown form refused, and every op's
step through the one dispatcher (``model.kernels=fla`` refused on a CPU by the step as by a form)."""

import pytest
import torch

from mcsd.ops.context import CHUNK, STEP, ForwardContext
from mcsd.ops.decayed_attention import decayed_attention_step
from mcsd.ops.kernels import KernelsUnavailable
from mcsd.ops.wkv import empty_wkv_state, wkv_step


def test_documents_become_starts_where_a_position_is_zero():
    position_ids = torch.tensor([[0, 1, 2, 0, 1], [3, 4, 0, 1, 2]])
    context = ForwardContext.of("chunk", "torch", 16, position_ids)
    assert torch.equal(context.starts, torch.tensor([[True, False, False, True, False],
                                                     [False, False, True, False, False]]))
    assert context.position_ids is position_ids and context.chunk_size == 16
    assert ForwardContext.of("parallel").starts is None


def test_an_unknown_form_is_refused_in_one_line():
    with pytest.raises(ValueError, match="form='fast' is unknown: use one of parallel, chunk, recurrent"):
        ForwardContext.of("fast")


def test_the_defaults_are_pytorch_forms_without_documents():
    assert (CHUNK.form, CHUNK.kernels, CHUNK.starts) == ("chunk", "torch", None)
    assert (STEP.form, STEP.kernels, STEP.starts) == ("recurrent", "torch", None)


def test_each_step_goes_through_the_dispatcher():
    q = k = torch.randn(2, 3, 4)
    v, state = torch.randn(2, 3, 5), torch.zeros(2, 3, 4, 5)
    with pytest.raises(KernelsUnavailable, match="model.kernels=fla runs Triton kernels on a CUDA GPU"):
        decayed_attention_step(q, k, v, torch.full((2, 3), -0.1), state, ForwardContext.step("fla"))
    key, value = torch.randn(2, 6), torch.randn(2, 6)
    with pytest.raises(KernelsUnavailable, match="model.kernels=fla runs Triton kernels on a CUDA GPU"):
        wkv_step(torch.rand(6), torch.randn(6), key, value, empty_wkv_state(2, 6, key.device, torch.float32),
                 ForwardContext.step("fla"))
    output, new_state = decayed_attention_step(q, k, v, torch.full((2, 3), -0.1), state, ForwardContext.step("auto"))
    assert torch.allclose(output, torch.einsum("bhk,bhk,bhv->bhv", q, k, v))  # from a zero state: q (k^T v)
    assert torch.allclose(new_state, k[..., :, None] * v[..., None, :])
