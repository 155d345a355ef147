"""flash-linear-attention's kernels on a GPU (``pytest -m gpu``; skipped without CUDA or fla): each
op's fla kernels against its PyTorch chunk form, forward and gradients, in fp32 and bf16; every
architecture with ``kernels=fla`` against ``kernels=torch`` (every form, decoding through CUDA
graphs); a few training steps with fla's kernels. The CPU tests of the same adapters run them
over fla's references (tests/ops/test_fla_backend.py).

Tolerances (relative RMS against the PyTorch chunk form in fp64): fp32 ``FP32_TOLERANCE`` (fla's
fp32 products may run in TF32), bf16 ``BF16_TOLERANCE`` (both sides round their inputs and
outputs to bf16; the PyTorch form keeps its states fp32, fla its chunk states in the input's dtype)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from helpers.models import decode_with_state, relative_rms_error, tiny_model
from helpers.runs import FAST, compose_train, read_metrics, series
from mcsd.ops.context import ForwardContext
from mcsd.models import registry
from mcsd.ops.decayed_attention import chunk_decayed_attention, decayed_attention, decayed_attention_step
from mcsd.ops.decayed_attention.fla_backend import gated_chunk_backward_refused
from mcsd.ops.exp_filter import chunk_exp_filter, exp_filter
from mcsd.ops.delta_rule import delta_rule, recurrent_delta_rule
from mcsd.ops.gla import chunk_gla, gla
from mcsd.ops.kernels import KernelsUnavailable, fla_import_problem
from mcsd.ops.wkv import chunk_wkv, wkv, wkv_step
from mcsd.training.run import train

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run pytest -m gpu on one"),
              pytest.mark.skipif(fla_import_problem() is not None, reason="needs fla: pip install 'mcsd[gpu]'")]
CUDA = torch.device("cuda")
FP32_TOLERANCE = 2e-3
BF16_TOLERANCE = 2e-2
TOLERANCE = {torch.float32: FP32_TOLERANCE, torch.bfloat16: BF16_TOLERANCE}
LENGTHS = [1, 65, 301, 2048]


def _random(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _compare(run, inputs: list[torch.Tensor], dtype: torch.dtype, cast: int, differentiate: list[int],
             state_view=lambda state: state) -> None:
    """``run(kernels, *inputs)`` -> (output, final state) with fla on the GPU (its first ``cast``
    inputs in ``dtype``, the rest fp32) against the PyTorch chunk form in fp64 on the GPU: outputs,
    final states (as ``state_view`` shows them) and the gradients of the inputs at
    ``differentiate``, within ``TOLERANCE[dtype]``."""
    reference_inputs = [tensor.to(CUDA, torch.float64).requires_grad_(index in differentiate)
                        for index, tensor in enumerate(inputs)]
    fla_inputs = [tensor.to(CUDA, dtype if index < cast else torch.float32).requires_grad_(index in differentiate)
                  for index, tensor in enumerate(inputs)]
    expected = run("torch", *reference_inputs)
    got = run("fla", *fla_inputs)
    assert got[0].dtype == dtype and got[1].dtype == torch.float32
    assert relative_rms_error(got[0], expected[0]) < TOLERANCE[dtype]
    assert relative_rms_error(state_view(got[1]), state_view(expected[1])) < TOLERANCE[dtype]
    if differentiate:
        cotangent = torch.randn(got[0].shape, generator=torch.Generator().manual_seed(9)).to(CUDA)
        expected_gradients = torch.autograd.grad((expected[0] * cotangent.double()).sum(),
                                                 [reference_inputs[index] for index in differentiate])
        gradients = torch.autograd.grad((got[0].float() * cotangent).sum(), [fla_inputs[index] for index in differentiate])
        for actual, wanted in zip(gradients, expected_gradients):
            if not wanted.any():  # x at length 1: position 0 reads the initial state alone
                assert not actual.any()
                continue
            assert relative_rms_error(actual, wanted) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_exp_filter_through_hgrn(form: str, length: int, dtype: torch.dtype) -> None:
    x = _random(2, 6, length, 32, seed=0).transpose(1, 2).contiguous().transpose(1, 2)  # MCSD's channels-first view
    log_decay = torch.log(torch.linspace(0.5, 0.999, 6))
    initial = _random(2, 6, 32, seed=1)

    def run(kernels, x, log_decay, initial):
        if kernels == "torch":
            return chunk_exp_filter(x, log_decay, initial)
        return exp_filter(x, log_decay, initial, context=ForwardContext(form, "fla"))

    _compare(run, [x, log_decay, initial], dtype, cast=1, differentiate=[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", [1, 65, 301])
@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_delta_rule_through_fla_gated_delta_rule(form: str, length: int, dtype: torch.dtype) -> None:
    """L2-normalised keys, beta in (0, 1), decays of Mamba-2's range, as a mixer hands them; the
    reference is the recurrent form (the chunk form's solve in fp64 on the GPU would be its own check)."""
    q = _random(2, 4, length, 64, seed=0, scale=64 ** -0.5)
    k = torch.nn.functional.normalize(_random(2, 4, length, 64, seed=1), dim=-1)
    v = _random(2, 4, length, 64, seed=2)
    beta = torch.rand(2, 4, length, generator=torch.Generator().manual_seed(5))
    log_decay = -torch.rand(2, 4, length, generator=torch.Generator().manual_seed(6)) * 0.1
    initial = _random(2, 4, 64, 64, seed=3)

    def run(kernels, q, k, v, beta, log_decay, initial):
        if kernels == "torch":
            return recurrent_delta_rule(q, k, v, beta, log_decay, initial)
        return delta_rule(q, k, v, beta, log_decay, initial, context=ForwardContext(form, "fla"))

    _compare(run, [q, k, v, beta, log_decay, initial], dtype, cast=3, differentiate=[0, 1, 2, 3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_gla_through_fla_gla(form: str, length: int, dtype: torch.dtype) -> None:
    """Per-key decays of GLA's range (``logsigmoid / 16``: -0.04 to 0)."""
    q, k, v = (_random(2, 4, length, 64, seed=seed, scale=64 ** -0.25) for seed in (0, 1, 2))
    log_decay = -torch.rand(2, 4, length, 64, generator=torch.Generator().manual_seed(4)) * 0.05
    initial = _random(2, 4, 64, 64, seed=3)

    def run(kernels, q, k, v, log_decay, initial):
        if kernels == "torch":
            return chunk_gla(q, k, v, log_decay, initial)
        return gla(q, k, v, log_decay, initial, context=ForwardContext(form, "fla"))

    _compare(run, [q, k, v, log_decay, initial], dtype, cast=3, differentiate=[0, 1, 2, 3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_decayed_attention_through_simple_gla(form: str, per_token: bool, length: int, dtype: torch.dtype) -> None:
    q, k, v = (_random(2, 4, length, 64, seed=seed, scale=64 ** -0.25) for seed in (0, 1, 2))
    log_decay = -torch.rand(2, 4, length) * 0.1 if per_token else torch.log1p(-(2.0 ** -torch.arange(5.0, 9.0)))
    initial = _random(2, 4, 64, 64, seed=3)

    def run(kernels, q, k, v, log_decay, initial):
        if kernels == "torch":
            return chunk_decayed_attention(q, k, v, log_decay, initial)
        return decayed_attention(q, k, v, log_decay, initial, context=ForwardContext(form, "fla"))

    refused = per_token and form == "chunk" and gated_chunk_backward_refused()
    _compare(run, [q, k, v, log_decay, initial], dtype, cast=3, differentiate=[] if refused else [0, 1, 2])
    if refused:  # fla's own refusal, said in one line (auto runs the PyTorch form: the CPU test)
        with pytest.raises(KernelsUnavailable, match="upgrade Triton to 3.7.1"):
            decayed_attention(*(tensor.to(CUDA).requires_grad_() for tensor in (q, k, v, log_decay)),
                    context=ForwardContext("chunk", "fla"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", LENGTHS)
def test_wkv_through_rwkv4(length: int, dtype: torch.dtype) -> None:
    k, v = _random(2, length, 96, seed=0), _random(2, length, 96, seed=1)
    w, u = torch.exp(_random(96, seed=2) - 2), _random(96, seed=3)
    initial = chunk_wkv(w, u, _random(2, 5, 96, seed=4), _random(2, 5, 96, seed=5))[1]

    def run(kernels, k, v, w, u, initial):
        if kernels == "torch":
            return chunk_wkv(w, u, k, v, initial)
        return wkv(w, u, k, v, initial, context=ForwardContext("chunk", "fla"))

    def what_it_holds(state: torch.Tensor) -> torch.Tensor:
        """(a, b, p) as the weighted average a / b and the log of the total weight log b + p: the
        same whatever scale p a form keeps."""
        a, b, p = state.double().unbind(1)
        return torch.stack([a / b, torch.log(b) + p], dim=1)

    _compare(run, [k, v, w, u, initial], dtype, cast=2, differentiate=[0, 1], state_view=what_it_holds)


def _document_starts() -> torch.Tensor:
    """``[2, 2048]`` bool on the GPU: row 0 documents of 1, 2, 63, 64, 65, 301 and 1,552 tokens;
    row 1 one going on from the initial state and one of 1,048 tokens."""
    starts = torch.zeros(2, 2048, dtype=torch.bool)
    starts[0, torch.tensor([0, 1, 2, 63, 64, 65, 301]).cumsum(0)] = True
    starts[1, 1000] = True
    return starts.to(CUDA)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_exp_filter_keeps_documents_apart_through_hgrn(form: str, dtype: torch.dtype) -> None:
    """A gate of -inf at each start in fla's kernels: the PyTorch chunk form with ``starts``."""
    starts = _document_starts()
    x = _random(2, 6, 2048, 32, seed=0).transpose(1, 2).contiguous().transpose(1, 2)
    log_decay = torch.log(torch.linspace(0.5, 0.999, 6))
    initial = _random(2, 6, 32, seed=1)

    def run(kernels, x, log_decay, initial):
        if kernels == "torch":
            return chunk_exp_filter(x, log_decay, initial, starts=starts)
        return exp_filter(x, log_decay, initial, context=ForwardContext(form, "fla", starts=starts))

    _compare(run, [x, log_decay, initial], dtype, cast=1, differentiate=[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_decayed_attention_keeps_documents_apart_through_simple_gla(form: str, per_token: bool,
                                                                    dtype: torch.dtype) -> None:
    """fla's variable-length sequences (``cu_seqlens``): the PyTorch chunk form with ``starts``."""
    starts = _document_starts()
    q, k, v = (_random(2, 4, 2048, 64, seed=seed, scale=64 ** -0.25) for seed in (0, 1, 2))
    log_decay = -torch.rand(2, 4, 2048) * 0.1 if per_token else torch.log1p(-(2.0 ** -torch.arange(5.0, 9.0)))
    initial = _random(2, 4, 64, 64, seed=3)

    def run(kernels, q, k, v, log_decay, initial):
        if kernels == "torch":
            return chunk_decayed_attention(q, k, v, log_decay, initial, starts=starts)
        return decayed_attention(q, k, v, log_decay, initial, context=ForwardContext(form, "fla", starts=starts))

    refused = per_token and form == "chunk" and gated_chunk_backward_refused()
    _compare(run, [q, k, v, log_decay, initial], dtype, cast=3, differentiate=[] if refused else [0, 1, 2])


@torch.no_grad()
def test_decoding_steps_through_fused_recurrences() -> None:
    """RetNet's and SSD's step (simple GLA) and RWKV-4's (its fused kernel) on the GPU, fla
    against PyTorch, one token after another for 64 tokens."""
    q, k = _random(2, 4, 64, seed=0).to(CUDA), _random(2, 4, 64, seed=1).to(CUDA)
    v, state = _random(2, 4, 32, seed=2).to(CUDA), torch.zeros(2, 4, 64, 32, device=CUDA)
    log_decay = torch.full((2, 4), -0.05, device=CUDA)
    fla_state, torch_state = state.clone(), state.clone()
    for _ in range(64):
        fla_output, fla_state = decayed_attention_step(q, k, v, log_decay, fla_state,
                context=ForwardContext.step("fla"))
        torch_output, torch_state = decayed_attention_step(q, k, v, log_decay, torch_state)
    assert relative_rms_error(fla_output, torch_output) < FP32_TOLERANCE
    assert relative_rms_error(fla_state, torch_state) < FP32_TOLERANCE
    w, u = torch.full((96,), 0.3, device=CUDA), torch.zeros(96, device=CUDA)
    fla_state = torch_state = chunk_wkv(w, u, torch.randn(2, 5, 96, device=CUDA), torch.randn(2, 5, 96, device=CUDA))[1]
    for step in range(64):
        key, value = torch.randn(2, 96, device=CUDA), torch.randn(2, 96, device=CUDA)
        fla_output, fla_state = wkv_step(w, u, key, value, fla_state, context=ForwardContext.step("fla"))
        torch_output, torch_state = wkv_step(w, u, key, value, torch_state)
        assert relative_rms_error(fla_output, torch_output) < FP32_TOLERANCE, step


@pytest.mark.parametrize("name", registry.architectures())
def test_every_architecture_with_fla_kernels_is_itself_on_the_gpu(name: str) -> None:
    """bf16 on the GPU: every form's logits with ``kernels=fla`` and ``kernels=torch`` (the same
    weights), the training loss's gradients (where fla serves the backward), and greedy decoding
    through CUDA graphs after a prompt."""
    model = tiny_model(name, hidden_size=128, num_channels=4, mlp_hidden_size=192, kernels="torch")
    model = model.to(CUDA, torch.bfloat16)
    fla = copy.deepcopy(model)
    fla.use_kernels("fla")
    ids = torch.randint(0, 101, (2, 200), device=CUDA)
    with torch.no_grad():
        for form in model.architecture.forms:
            assert relative_rms_error(fla(ids, form=form).float(), model(ids, form=form).float()) < BF16_TOLERANCE, form
    if not (name == "wonderful_matrices" and gated_chunk_backward_refused()):
        losses = [each.loss(ids[:, :-1], ids[:, 1:])[0] for each in (model, fla)]
        for loss in losses:
            loss.backward()
        assert relative_rms_error(losses[1].float(), losses[0].float()) < 1e-2
        gradients = [torch.cat([parameter.grad.float().flatten() for parameter in each.parameters()])
                     for each in (model, fla)]
        assert relative_rms_error(gradients[1], gradients[0]) < 5e-2
    with torch.no_grad():  # decoding along a fixed token path: CUDA graphs (fla) against the eager step (torch)
        expected = decode_with_state(model, ids[:, :48], split=16)[0]
        prefill, step = fla.decoding(cuda_graphs=True)
        logits, state = prefill(ids[:, :16], max_new_tokens=32)
        outputs = [logits]
        for position in range(16, 48):
            logits, state = step(ids[:, position].clone(), state)
            outputs.append(logits)
        assert step.recorded == 1 and step.replayed == 32
        assert relative_rms_error(torch.stack(outputs, dim=1).float(), expected.float()) < BF16_TOLERANCE


@pytest.mark.parametrize("name", ["mcsd", "retnet", "rwkv4", "wonderful_matrices"])
def test_a_few_training_steps_with_fla_kernels(tmp_path: Path, name: str) -> None:
    """``trainer=gpu model.kernels=fla`` (auto for the hybrid where fla refuses its SSD's
    backward): six steps, every loss finite and the validation loss too."""
    kernels = "auto" if name == "wonderful_matrices" and gated_chunk_backward_refused() else "fla"
    val_loss = train(compose_train(tmp_path / "run", *FAST, "trainer=gpu", "logger=csv", "test_after_training=false",
                                   f"model={name}", f"model.kernels={kernels}"))
    losses = series(read_metrics(tmp_path / "run"), "train/loss")
    assert len(losses) == 6 and all(math.isfinite(loss) for loss in losses) and math.isfinite(val_loss)
