"""The fla backend (``mcsd/ops/*/fla_backend.py``, :mod:`mcsd.ops.kernels`): each adapter, run over
flash-linear-attention's own pure-PyTorch references, equals this project's parallel form (outputs,
final states, gradients; initial states, odd lengths, per-head and per-token decays, the filter's
strict causality); fla's kernels take the arguments the adapters pass them; ``model.kernels``
decides where they run. Every architecture with ``kernels=fla`` routed through the references
equals itself with ``kernels=torch``. fla's Triton kernels run on a GPU (``tests/gpu/``) and, its
fused recurrences, in Triton's interpreter here (the slow test at the end).

fla's references compute in fp32 whatever they are given, so the inputs are fp32 and the
parallel forms they are held to run in fp64."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.documents import packed_starts
from helpers.fla_references import naive_recurrent_rwkv4, with_gla_keywords, with_head_decay, with_sequences
from helpers.models import TINY, decode_with_state, relative_rms_error, tiny_model
from mcsd.ops.context import ForwardContext
from mcsd.models import registry
from mcsd.ops import kernels
from mcsd.ops.decayed_attention import decayed_attention_step, fla_decayed_attention, parallel_decayed_attention
from mcsd.ops.decayed_attention.fla_backend import fla_decayed_attention_step
from mcsd.ops.delta_rule import delta_rule_step, fla_delta_rule, recurrent_delta_rule
from mcsd.ops.delta_rule.fla_backend import fla_delta_rule_step
from mcsd.ops.exp_filter import fla_exp_filter, parallel_exp_filter
from mcsd.ops.gla import fla_gla, gla_step, parallel_gla
from mcsd.ops.gla.fla_backend import DECAY_KEYWORD, fla_gla_step
from mcsd.ops.kernels import FLA_KERNELS, KernelsUnavailable, uses_fla
from mcsd.ops.wkv import fla_wkv, parallel_wkv, wkv_step
from mcsd.ops.wkv.fla_backend import fla_wkv_step

hgrn_naive = pytest.importorskip("fla.ops.hgrn.naive", reason="flash-linear-attention (fla-core: the dev extra)")
simple_gla_naive = pytest.importorskip("fla.ops.simple_gla.naive")
naive_recurrent_gla = pytest.importorskip("fla.ops.gla.naive").naive_recurrent_gla
gated_delta_rule_naive = pytest.importorskip("fla.ops.gated_delta_rule.naive")
naive_recurrent_hgrn = hgrn_naive.naive_recurrent_hgrn
naive_chunk_simple_gla, naive_recurrent_simple_gla = (simple_gla_naive.naive_chunk_simple_gla,
                                                      simple_gla_naive.naive_recurrent_simple_gla)

LENGTHS = [1, 63, 64, 65, 301]
TOLERANCE = 1e-5  # relative RMS: fp32 references against fp64 parallel forms
REFERENCES = {"chunk": with_head_decay(naive_chunk_simple_gla), "recurrent": with_head_decay(naive_recurrent_simple_gla)}


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_close(actual: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...]) -> None:
    for got, want in zip(actual, expected, strict=True):
        assert got.shape == want.shape
        if not want.any():  # length 1 from no state (or a decay's gradient there): nothing to relate to
            assert got.abs().max() < 1e-6
            continue
        assert relative_rms_error(got, want) < TOLERANCE


def gradients(outputs: tuple[torch.Tensor, torch.Tensor], inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The gradients of a fixed random projection of (output, final state) with respect to ``inputs``."""
    weights = [torch.randn(tensor.shape, generator=generator(1)).to(tensor.dtype) for tensor in outputs]
    loss = sum((tensor * weight).sum() for tensor, weight in zip(outputs, weights))
    return torch.autograd.grad(loss, inputs)


def fp64(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if tensor is None else tensor.detach().double().requires_grad_(tensor.requires_grad)
            for tensor in tensors]


# The exponential filter through HGRN


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("with_initial_state", [False, True])
@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_exp_filter_over_hgrn_is_the_parallel_form(length: int, with_initial_state: bool, form: str) -> None:
    x = torch.randn(2, 3, length, 4, generator=generator()).requires_grad_()
    log_decay = torch.log(torch.tensor([0.5, 0.9, 0.999]))
    initial = torch.randn(2, 3, 4, generator=generator(2)).requires_grad_() if with_initial_state else None
    got = fla_exp_filter(x, log_decay, initial, form, kernel=naive_recurrent_hgrn)
    x64, initial64 = fp64(x, initial)
    expected = parallel_exp_filter(x64, log_decay.double(), initial64)
    assert got[0].dtype == x.dtype and got[1].dtype == torch.float32
    assert_close(got, expected)
    leaves = [x] + ([initial] if with_initial_state else [])
    assert_close(gradients(got, leaves), gradients(expected, [x64] + ([initial64] if with_initial_state else [])))


def test_exp_filter_over_hgrn_is_strictly_causal() -> None:
    """Position 0 reads the initial state alone and position n nothing of token n: the shift."""
    x = torch.randn(1, 2, 10, 3, generator=generator())
    log_decay = torch.log(torch.tensor([0.8, 0.95]))
    initial = torch.randn(1, 2, 3, generator=generator(2))
    output, _ = fla_exp_filter(x, log_decay, initial, kernel=naive_recurrent_hgrn)
    assert torch.equal(output[:, :, 0], initial)
    changed = x.clone()
    changed[:, :, 5] += 1.0
    moved, _ = fla_exp_filter(changed, log_decay, initial, kernel=naive_recurrent_hgrn)
    assert torch.equal(moved[:, :, :6], output[:, :, :6]) and not torch.allclose(moved[:, :, 6], output[:, :, 6])


def test_exp_filter_adapter_reads_channels_last_memory_as_a_view() -> None:
    """The MCSD block hands the filter a channels-first view of ``[B, N, C, D]``: fla reads it as it is."""
    seen = []

    def kernel(features, g, initial_state, output_final_state):
        seen.append(features)
        return naive_recurrent_hgrn(features, g, initial_state, output_final_state)

    channels_last = torch.randn(2, 7, 3, 4, generator=generator())
    fla_exp_filter(channels_last.transpose(1, 2), torch.full((3,), -0.1), kernel=kernel)
    assert seen[0].data_ptr() == channels_last.data_ptr()


# Decayed attention through simple GLA


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("with_initial_state", [False, True])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_decayed_attention_over_simple_gla_is_the_parallel_form(
    length: int, with_initial_state: bool, per_token: bool, form: str
) -> None:
    q, k = (torch.randn(2, 3, length, 4, generator=generator(seed)).requires_grad_() for seed in (0, 1))
    v = torch.randn(2, 3, length, 5, generator=generator(2)).requires_grad_()
    log_decay = (-torch.rand(2, 3, length, generator=generator(3)) * 0.5 if per_token
                 else torch.log1p(-(2.0 ** -torch.arange(5.0, 8.0)))).requires_grad_(per_token)
    initial = torch.randn(2, 3, 4, 5, generator=generator(4)).requires_grad_() if with_initial_state else None
    got = fla_decayed_attention(q, k, v, log_decay, initial, form, kernel=REFERENCES[form])
    q64, k64, v64, log_decay64, initial64 = fp64(q, k, v, log_decay, initial)
    expected = parallel_decayed_attention(q64, k64, v64, log_decay64, initial64)
    assert got[0].dtype == v.dtype and got[1].dtype == torch.float32
    assert_close(got, expected)
    leaves = [q, k, v] + ([log_decay] if per_token else [])
    leaves64 = [q64, k64, v64] + ([log_decay64] if per_token else [])
    if form == "recurrent" and with_initial_state:  # the chunk reference starts from its state in place: no gradient
        leaves, leaves64 = leaves + [initial], leaves64 + [initial64]
    assert_close(gradients(got, leaves), gradients(expected, leaves64))


def test_decayed_attention_hands_fla_one_dtype() -> None:
    """fla's kernels take q, k and v in one dtype: fp32 queries and keys beside bf16 values (an
    SSD under autocast) reach it in bf16, as autocast's products would take them."""
    seen = []

    def kernel(q, k, v, **kwargs):
        seen.append((q.dtype, k.dtype, v.dtype))
        return REFERENCES["chunk"](q, k, v, **kwargs)

    q, k = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    v = torch.randn(1, 2, 5, 4).to(torch.bfloat16)
    output, final = fla_decayed_attention(q, k, v, torch.full((2,), -0.1), kernel=kernel)
    assert seen == [(torch.bfloat16,) * 3] and output.dtype == torch.bfloat16 and final.dtype == torch.float32


def test_decayed_attention_step_over_simple_gla_is_the_step() -> None:
    q, k = (torch.randn(2, 3, 4, generator=generator(seed)) for seed in (0, 1))
    v = torch.randn(2, 3, 5, generator=generator(2))
    log_decay = -torch.rand(2, 3, generator=generator(3))
    state = torch.randn(2, 3, 4, 5, generator=generator(4))
    got = fla_decayed_attention_step(q, k, v, log_decay, state, kernel=REFERENCES["recurrent"])
    assert_close(got, decayed_attention_step(*fp64(q, k, v, log_decay, state)))


# Documents apart: HGRN's gate at -inf at each start, simple GLA's variable-length sequences


@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_exp_filter_over_hgrn_keeps_documents_apart(form: str) -> None:
    """With ``starts``, the filter's outputs, final state and gradients (of the inputs, the decays
    and the initial state, which row 1's first document goes on from) are the parallel form's,
    which computes each document alone (tests/ops/test_exp_filter.py)."""
    starts = packed_starts()
    x = torch.randn(2, 3, starts.shape[1], 4, generator=generator()).requires_grad_()
    log_decay = torch.log(torch.tensor([0.5, 0.9, 0.999])).requires_grad_()
    initial = torch.randn(2, 3, 4, generator=generator(2)).requires_grad_()
    got = fla_exp_filter(x, log_decay, initial, form, kernel=naive_recurrent_hgrn, starts=starts)
    x64, log_decay64, initial64 = fp64(x, log_decay, initial)
    expected = parallel_exp_filter(x64, log_decay64, initial64, starts)
    assert_close(got, expected)
    assert not got[0].transpose(1, 2)[starts].any()  # a document's first token reads no history
    assert_close(gradients(got, [x, log_decay, initial]), gradients(expected, [x64, log_decay64, initial64]))


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_decayed_attention_over_simple_gla_keeps_documents_apart(per_token: bool, form: str) -> None:
    """With ``starts``, fla's variable-length sequences give the parallel form's outputs, final
    states and gradients, for RetNet's per-head decay and the SSD's per-token one."""
    starts = packed_starts()
    length = starts.shape[1]
    q, k = (torch.randn(2, 3, length, 4, generator=generator(seed)).requires_grad_() for seed in (0, 1))
    v = torch.randn(2, 3, length, 5, generator=generator(2)).requires_grad_()
    log_decay = (-torch.rand(2, 3, length, generator=generator(3)) * 0.5 if per_token
                 else torch.log1p(-(2.0 ** -torch.arange(5.0, 8.0)))).requires_grad_(per_token)
    initial = torch.randn(2, 3, 4, 5, generator=generator(4)).requires_grad_()
    got = fla_decayed_attention(q, k, v, log_decay, initial, form, kernel=REFERENCES[form], starts=starts)
    q64, k64, v64, log_decay64, initial64 = fp64(q, k, v, log_decay, initial)
    expected = parallel_decayed_attention(q64, k64, v64, log_decay64, initial64, starts)
    assert got[0].dtype == v.dtype and got[1].dtype == torch.float32
    assert_close(got, expected)
    leaves = [q, k, v] + ([log_decay] if per_token else [])
    leaves64 = [q64, k64, v64] + ([log_decay64] if per_token else [])
    if form == "recurrent":  # the chunk reference starts from its state in place: no gradient
        leaves, leaves64 = leaves + [initial], leaves64 + [initial64]
    assert_close(gradients(got, leaves), gradients(expected, leaves64))


# Gated linear attention through GLA


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("with_initial_state", [False, True])
@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_gla_over_fla_gla_is_the_parallel_form(length: int, with_initial_state: bool, form: str) -> None:
    """Outputs, final states and gradients (of q, k, v, the per-key decays and the initial state)
    through fla's GLA reference (``naive_recurrent_gla``, called as ``chunk_gla`` and
    ``fused_recurrent_gla`` are) equal the parallel form in fp64."""
    q, k = (torch.randn(2, 3, length, 4, generator=generator(seed)).requires_grad_() for seed in (0, 1))
    v = torch.randn(2, 3, length, 5, generator=generator(2)).requires_grad_()
    log_decay = (-torch.rand(2, 3, length, 4, generator=generator(3)) * 0.5).requires_grad_()
    initial = torch.randn(2, 3, 4, 5, generator=generator(4)).requires_grad_() if with_initial_state else None
    got = fla_gla(q, k, v, log_decay, initial, form, kernel=REFERENCE_KERNELS[("gla", form)])
    q64, k64, v64, log_decay64, initial64 = fp64(q, k, v, log_decay, initial)
    expected = parallel_gla(q64, k64, v64, log_decay64, initial64)
    assert got[0].dtype == v.dtype and got[1].dtype == torch.float32
    assert_close(got, expected)
    leaves = [q, k, v, log_decay] + ([initial] if with_initial_state else [])
    leaves64 = [q64, k64, v64, log_decay64] + ([initial64] if with_initial_state else [])
    assert_close(gradients(got, leaves), gradients(expected, leaves64))


@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_gla_over_fla_gla_keeps_documents_apart(form: str) -> None:
    starts = packed_starts()
    length = starts.shape[1]
    q, k = (torch.randn(2, 3, length, 4, generator=generator(seed)).requires_grad_() for seed in (0, 1))
    v = torch.randn(2, 3, length, 5, generator=generator(2)).requires_grad_()
    log_decay = (-torch.rand(2, 3, length, 4, generator=generator(3)) * 0.5).requires_grad_()
    initial = torch.randn(2, 3, 4, 5, generator=generator(4)).requires_grad_()
    got = fla_gla(q, k, v, log_decay, initial, form, kernel=REFERENCE_KERNELS[("gla", form)], starts=starts)
    q64, k64, v64, log_decay64, initial64 = fp64(q, k, v, log_decay, initial)
    expected = parallel_gla(q64, k64, v64, log_decay64, initial64, starts)
    assert_close(got, expected)
    assert_close(gradients(got, [q, k, v, log_decay, initial]),
                 gradients(expected, [q64, k64, v64, log_decay64, initial64]))


def test_gla_step_over_fla_gla_is_the_step() -> None:
    q, k, log_decay = (torch.randn(2, 3, 4, generator=generator(seed)) for seed in (0, 1, 3))
    v = torch.randn(2, 3, 5, generator=generator(2))
    state = torch.randn(2, 3, 4, 5, generator=generator(4))
    got = fla_gla_step(q, k, v, -log_decay.abs(), state, kernel=REFERENCE_KERNELS[("gla", "recurrent")])
    assert_close(got, gla_step(*fp64(q, k, v, -log_decay.abs(), state)))


# The gated delta rule through fla's gated delta rule


def delta_rule_inputs(length: int) -> list[torch.Tensor]:
    q = torch.randn(2, 3, length, 4, generator=generator(0)).requires_grad_()
    k = torch.nn.functional.normalize(torch.randn(2, 3, length, 4, generator=generator(1)), dim=-1).requires_grad_()
    v = torch.randn(2, 3, length, 5, generator=generator(2)).requires_grad_()
    beta = torch.rand(2, 3, length, generator=generator(3)).requires_grad_()
    log_decay = (-torch.rand(2, 3, length, generator=generator(5)) * 0.3).requires_grad_()
    return [q, k, v, beta, log_decay]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("with_initial_state", [False, True])
@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_delta_rule_over_fla_gated_delta_rule_is_the_recurrent_form(length: int, with_initial_state: bool,
                                                                     form: str) -> None:
    """Outputs, final states and gradients through fla's gated delta rule references (its naive
    chunk and recurrent ones, called as ``chunk_gated_delta_rule`` and
    ``fused_recurrent_gated_delta_rule`` are) equal this project's recurrent form in fp64."""
    leaves = delta_rule_inputs(length)
    initial = torch.randn(2, 3, 4, 5, generator=generator(4)).requires_grad_() if with_initial_state else None
    got = fla_delta_rule(*leaves, initial, form, kernel=REFERENCE_KERNELS[("delta_rule", form)])
    leaves64 = fp64(*leaves, initial)
    expected = recurrent_delta_rule(*leaves64)
    assert got[0].dtype == leaves[2].dtype and got[1].dtype == torch.float32
    assert_close(got, expected)
    differentiated = leaves + ([initial] if with_initial_state else [])
    assert_close(gradients(got, differentiated), gradients(expected, leaves64[:len(differentiated)]))


@pytest.mark.parametrize("form", ["chunk", "recurrent"])
def test_delta_rule_over_fla_gated_delta_rule_keeps_documents_apart(form: str) -> None:
    starts = packed_starts()
    leaves = delta_rule_inputs(starts.shape[1])
    initial = torch.randn(2, 3, 4, 5, generator=generator(4))
    got = fla_delta_rule(*leaves, initial, form, kernel=REFERENCE_KERNELS[("delta_rule", form)], starts=starts)
    expected = recurrent_delta_rule(*fp64(*leaves, initial), starts)
    assert_close(got, expected)


def test_delta_rule_step_over_fla_gated_delta_rule_is_the_step() -> None:
    q, k, v, beta, log_decay = (tensor[:, :, 0].detach() for tensor in delta_rule_inputs(1))
    state = torch.randn(2, 3, 4, 5, generator=generator(4))
    got = fla_delta_rule_step(q, k, v, beta, log_decay, state, kernel=REFERENCE_KERNELS[("delta_rule", "recurrent")])
    assert_close(got, delta_rule_step(*fp64(q, k, v, beta, log_decay, state)))


# RWKV-4's WKV through fla's fused recurrence, as its Triton source reads


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("with_initial_state", [False, True])
def test_wkv_over_rwkv4_is_the_parallel_form(length: int, with_initial_state: bool) -> None:
    w = torch.rand(6, generator=generator()) + 0.05
    u = torch.randn(6, generator=generator(1))
    k, v = (torch.randn(2, length, 6, generator=generator(seed)).requires_grad_() for seed in (2, 3))
    initial = (parallel_wkv(w, u, torch.randn(2, 5, 6, generator=generator(4)), torch.randn(2, 5, 6))[1]
               if with_initial_state else None)
    got = fla_wkv(w, u, k, v, initial, kernel=naive_recurrent_rwkv4)
    w64, u64, k64, v64, initial64 = fp64(w, u, k, v, initial)
    expected = parallel_wkv(w64, u64, k64, v64, initial64)
    assert got[0].dtype == v.dtype and got[1].dtype == torch.float32
    assert_close(got[0:1], expected[0:1])
    assert_close(got[1][:, :2] * torch.exp(got[1][:, 2:] - expected[1][:, 2:]), expected[1][:, :2])  # (a, b) at one scale
    assert_close(gradients(got[0:1], [k, v]), gradients(expected[0:1], [k64, v64]))


def test_wkv_step_over_rwkv4_is_the_step() -> None:
    w, u = torch.rand(6, generator=generator()) + 0.05, torch.randn(6, generator=generator(1))
    k, v = (torch.randn(2, 6, generator=generator(seed)) for seed in (2, 3))
    state = parallel_wkv(w, u, torch.randn(2, 5, 6, generator=generator(4)), torch.randn(2, 5, 6))[1]
    output, got = fla_wkv_step(w, u, k, v, state, kernel=naive_recurrent_rwkv4)
    expected_output, expected = wkv_step(*fp64(w, u, k, v, state))
    assert_close((output, got), (expected_output, expected))


# fla's conventions


@pytest.mark.parametrize(("op", "form"), list(FLA_KERNELS))
def test_fla_kernels_take_the_arguments_the_adapters_pass(op: str, form: str) -> None:
    """The adapters call HGRN and RWKV-4 positionally, simple GLA by keyword: a rename or a new
    order in fla fails here, before a GPU sees it."""
    parameters = list(inspect.signature(kernels.fla_kernel(op, form)).parameters)
    expected = {"exp_filter": ["x", "g", "initial_state", "output_final_state"],
                "wkv": ["w", "u", "k", "v", "state"]}
    if op in expected:
        assert parameters[:len(expected[op])] == expected[op]
    elif op == "delta_rule":
        assert {"q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state",
                "cu_seqlens"} <= set(parameters)
    elif op == "gla":
        assert {"q", "k", "v", DECAY_KEYWORD[form], "scale", "initial_state", "output_final_state",
                "cu_seqlens"} <= set(parameters)
    else:
        assert {"q", "k", "v", "g", "g_gamma", "scale", "initial_state", "output_final_state"} <= set(parameters)


# Where the kernels run


def test_kernels_setting_decides_where_fla_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not uses_fla("torch", cuda, "chunk") and not uses_fla("fla", cuda, "parallel")
    assert uses_fla("auto", cuda, "chunk") and uses_fla("fla", cuda, "recurrent")
    assert not uses_fla("auto", cpu, "chunk")
    with pytest.raises(KernelsUnavailable, match=r"model.kernels=fla runs Triton kernels on a CUDA GPU.*on cpu.*"
                                                 r"model.kernels=auto"):
        uses_fla("fla", cpu, "chunk")
    monkeypatch.setattr(kernels, "fla_import_problem", lambda: "ModuleNotFoundError: No module named 'fla'")
    assert not uses_fla("auto", cuda, "chunk")
    with pytest.raises(KernelsUnavailable, match=r"do not import here \(ModuleNotFoundError.*pip install 'mcsd\[gpu\]'"):
        uses_fla("fla", cuda, "chunk")


def test_unknown_kernels_are_refused_in_one_line() -> None:
    from mcsd.models.config import ConfigError

    with pytest.raises(ConfigError, match=r"model.kernels='triton' is unknown: use one of auto, torch, fla"):
        tiny_model("retnet", kernels="triton")
    model = tiny_model("retnet")
    with pytest.raises(ConfigError, match="model.kernels='cuda' is unknown"):
        model.use_kernels("cuda")


REFERENCE_KERNELS = {
    ("exp_filter", "chunk"): naive_recurrent_hgrn,
    ("exp_filter", "recurrent"): naive_recurrent_hgrn,
    ("decayed_attention", "chunk"): with_head_decay(naive_chunk_simple_gla),
    ("decayed_attention", "recurrent"): with_head_decay(naive_recurrent_simple_gla),
    ("delta_rule", "chunk"): with_sequences(gated_delta_rule_naive.naive_chunk_gated_delta_rule),
    ("delta_rule", "recurrent"): with_sequences(gated_delta_rule_naive.naive_recurrent_gated_delta_rule),
    ("gla", "chunk"): with_gla_keywords(naive_recurrent_gla),
    ("gla", "recurrent"): with_gla_keywords(naive_recurrent_gla),
    ("wkv", "chunk"): naive_recurrent_rwkv4,
    ("wkv", "recurrent"): naive_recurrent_rwkv4,
}


@pytest.fixture
def fla_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """fla's kernels replaced by its references (and the CPU taken for a device they run on);
    returns the list that records each (op, form) served."""
    served = []

    def fla_kernel(op: str, form: str):
        def kernel(*args, **kwargs):
            served.append((op, form))
            return REFERENCE_KERNELS[(op, form)](*args, **kwargs)
        return kernel

    for module in ("exp_filter", "decayed_attention", "delta_rule", "gla", "wkv"):
        monkeypatch.setattr(f"mcsd.ops.{module}.fla_backend.fla_kernel", fla_kernel)
    monkeypatch.setattr(kernels, "fla_runs_on", lambda device: True)
    return served


@pytest.mark.parametrize("name", registry.architectures())
def test_every_architecture_with_fla_kernels_is_itself(name: str, fla_on_the_cpu: list) -> None:
    """Each architecture's default variant: logits of every form it has, the training loss's
    gradients and greedy decoding after a prompt, with ``kernels=fla`` (fla's references standing
    in for its kernels) and with ``kernels=torch``; the mixers that have an fla op did route through it."""
    model = tiny_model(name, kernels="torch").eval()
    tokens = torch.randint(0, TINY["vocab_size"], (2, 70), generator=generator())

    def loss_gradients() -> torch.Tensor:
        model.zero_grad()
        model.loss(tokens[:, :-1], tokens[:, 1:])[0].backward()
        return torch.cat([parameter.grad.flatten() for parameter in model.parameters() if parameter.grad is not None])

    expected_gradients = loss_gradients()
    with torch.no_grad():
        expected = {form: model(tokens, form=form) for form in model.architecture.forms}
        expected_decoded = model.generate(tokens[:, :9], max_new_tokens=6)
    model.use_kernels("fla")
    assert model.config.kernels == "fla"
    assert relative_rms_error(loss_gradients(), expected_gradients) < TOLERANCE
    with torch.no_grad():
        for form, logits in expected.items():
            assert relative_rms_error(model(tokens, form=form), logits) < TOLERANCE, form
        assert torch.equal(model.generate(tokens[:, :9], max_new_tokens=6), expected_decoded)
    assert {op for op, _ in fla_on_the_cpu} == set(model.architecture.fla_ops)  # the ops it says it runs


@pytest.mark.parametrize("name", registry.architectures())
def test_every_architecture_with_fla_kernels_keeps_documents_apart(name: str, fla_on_the_cpu: list,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """With documents apart (``position_ids``), ``kernels=auto`` where fla runs (its references
    standing in) gives the logits of every form and the loss's gradients of ``kernels=torch``:
    fla serves the filter and decayed attention with their documents apart, and RWKV-4's WKV,
    which fla's kernel cannot reset at a start, runs its PyTorch form, said once."""
    model = tiny_model(name, kernels="torch").eval()
    tokens = torch.randint(0, TINY["vocab_size"], (2, 70), generator=generator())
    position_ids = torch.cat([torch.arange(length) for length in (1, 2, 63, 4)]).repeat(2, 1)
    position_ids[1] = torch.cat([torch.arange(30), torch.arange(40)])

    def loss_gradients() -> torch.Tensor:
        model.zero_grad()
        model.loss(tokens[:, :-1], tokens[:, 1:], position_ids=position_ids[:, :-1])[0].backward()
        return torch.cat([parameter.grad.flatten() for parameter in model.parameters() if parameter.grad is not None])

    expected_gradients = loss_gradients()
    with torch.no_grad():
        expected = {form: model(tokens, form=form, position_ids=position_ids) for form in model.architecture.forms}
    model.use_kernels("auto")
    with caplog.at_level("WARNING", logger="mcsd.ops.kernels"):
        assert relative_rms_error(loss_gradients(), expected_gradients) < TOLERANCE
        with torch.no_grad():
            for form, logits in expected.items():
                assert relative_rms_error(model(tokens, form=form, position_ids=position_ids), logits) < TOLERANCE, form
    served = {op for op, _ in fla_on_the_cpu}
    assert served == set(model.architecture.fla_ops) - {"wkv"}
    assert ("fla's RWKV-4 kernel cannot keep documents apart" in caplog.text) == ("wkv" in model.architecture.ops)


def static_step_logits(model, tokens: torch.Tensor, split: int) -> torch.Tensor:
    """The logits of the step that CUDA graphs replay (each replay a call: ``record="call"``)
    after a prefill of ``tokens[:, :split]``, from position ``split - 1`` on."""
    from mcsd.models.cuda_graphs import StaticStep

    step = StaticStep(model, record="call", min_capacity=4)
    logits, state = step.prefill(tokens[:, :split], max_new_tokens=tokens.shape[1] - split)
    outputs = [logits]
    for position in range(split, tokens.shape[1]):
        logits, state = step(tokens[:, position].clone(), state)
        outputs.append(logits)
    return torch.stack(outputs, dim=1)


@pytest.mark.parametrize("name", registry.architectures())
@torch.no_grad()
def test_the_step_at_fixed_addresses_runs_through_fla(name: str, fla_on_the_cpu: list) -> None:
    """The step that CUDA graphs replay (here each replay a call: ``record="call"``), with
    ``kernels=fla``, follows the eager step with ``kernels=torch`` along a fixed token path, its
    recurrent states written where the recording reads them."""
    model = tiny_model(name, kernels="torch").eval()
    tokens = torch.randint(0, TINY["vocab_size"], (2, 24), generator=generator())
    expected = decode_with_state(model, tokens, split=8)[0]
    model.use_kernels("fla")
    assert relative_rms_error(static_step_logits(model, tokens, split=8), expected) < TOLERANCE
    assert {op for op, _ in fla_on_the_cpu} == set(model.architecture.fla_ops)


@pytest.mark.parametrize(("case", "ops"), [("mcsd/full+decay_norm=sum", {("exp_filter", "recurrent")}),
                                         ("mcsd/input_decay", {("exp_filter", "recurrent"),
                                                               ("decayed_attention", "recurrent")})])
@torch.no_grad()
def test_mcsd_recurrent_form_and_step_run_through_fla_in_every_reading(case: str, ops: set, fla_on_the_cpu: list) -> None:
    """MCSD's recurrent form and decoding step with ``kernels=fla`` (a raw and an averaged output,
    an averaged state, an input decay) equal ``kernels=torch``: its logits, eager decoding and the
    step at fixed addresses, every one through fla's fused recurrences."""
    model = tiny_model(case, kernels="torch").eval()
    tokens = torch.randint(0, TINY["vocab_size"], (2, 24), generator=generator())
    expected_logits = model(tokens, form="recurrent")
    expected = decode_with_state(model, tokens, split=8)[0]
    model.use_kernels("fla")
    assert relative_rms_error(model(tokens, form="recurrent"), expected_logits) < TOLERANCE
    assert set(fla_on_the_cpu) == ops
    fla_on_the_cpu.clear()
    assert relative_rms_error(decode_with_state(model, tokens, split=8)[0], expected) < TOLERANCE
    assert relative_rms_error(static_step_logits(model, tokens, split=8), expected) < TOLERANCE
    assert {form for _, form in fla_on_the_cpu} >= {"recurrent"} and {op for op, _ in fla_on_the_cpu} == {op for op, _ in ops}


@pytest.mark.slow
def test_a_compiled_model_runs_fla_between_its_graphs(fla_on_the_cpu: list) -> None:
    """``torch.compile`` leaves the adapters (and fla's kernels) out of its graphs, asks once
    whether fla imports, and computes what the eager model does (where dynamo breaks its graphs is
    what this checks: traced without inductor)."""
    model = tiny_model("retnet", kernels="fla", num_layers=1)
    tokens = torch.randint(0, TINY["vocab_size"], (2, 40), generator=generator())
    expected = model.loss(tokens[:, :-1], tokens[:, 1:])[0]
    torch._dynamo.reset()
    compiled = torch.compile(model.loss)
    for _ in range(2):
        assert relative_rms_error(compiled(tokens[:, :-1], tokens[:, 1:])[0], expected) < TOLERANCE
    assert fla_on_the_cpu.count(("decayed_attention", "chunk")) == 3  # eager once, compiled twice


def test_what_fla_refuses_runs_the_pytorch_form_under_auto(fla_on_the_cpu: list, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A per-token decay's chunk backward on a GPU where fla refuses it (Hopper, Triton 3.4 to
    3.7.0), or 16-bit keys of odd width that will be differentiated: under auto the PyTorch form,
    said once; under fla one line with the fix. Without gradients, or with a per-head decay, fla serves."""
    from mcsd.ops import decayed_attention as package

    monkeypatch.setattr(package.fla_backend, "gated_chunk_backward_refused", lambda: True)
    q, k = (torch.randn(1, 2, 9, 4, generator=generator(seed)).requires_grad_() for seed in (0, 1))
    v = torch.randn(1, 2, 9, 4, generator=generator(2))
    per_token = -torch.rand(1, 2, 9, generator=generator(3))
    expected = parallel_decayed_attention(q, k, v, per_token)[0]
    with caplog.at_level("WARNING", logger="mcsd.ops.kernels"):
        got = package.decayed_attention(q, k, v, per_token, context=ForwardContext("chunk", "auto"))[0]
    assert fla_on_the_cpu == [] and relative_rms_error(got, expected) < TOLERANCE
    assert "Triton" in caplog.text and "upgrade Triton to 3.7.1" in caplog.text
    with pytest.raises(KernelsUnavailable, match=r"model.kernels=fla: fla refuses the backward .* per-token decay .*"
                                                 r"upgrade Triton to 3.7.1 or later; or use model.kernels=auto"):
        package.decayed_attention(q, k, v, per_token, context=ForwardContext("chunk", "fla"))
    with torch.no_grad():
        package.decayed_attention(q, k, v, per_token, context=ForwardContext("chunk", "fla"))
    package.decayed_attention(q, k, v, torch.full((2,), -0.1), context=ForwardContext("chunk", "fla"))
    assert fla_on_the_cpu == [("decayed_attention", "chunk")] * 2
    odd = torch.randn(1, 2, 9, 3, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(KernelsUnavailable, match="even key and value widths in 16-bit, and these are 3 and 3"):
        package.decayed_attention(odd, odd, odd, torch.full((2,), -0.1), context=ForwardContext("chunk", "fla"))


# fla's own kernels, in Triton's interpreter


@pytest.mark.slow
def test_fla_fused_recurrences_in_the_triton_interpreter() -> None:
    """fla's fused recurrent kernels (HGRN, simple GLA, RWKV-4: forward and backward) run on the
    CPU in Triton's interpreter, through the adapters, and equal the parallel forms, HGRN's and
    simple GLA's with documents apart too (a gate of -inf; variable-length sequences); the RWKV-4
    reference the tests above use equals fla's kernel. (Its chunk kernels use what the
    interpreter lacks: the GPU tests hold them.)"""
    tests = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get(
        "PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "helpers.fla_interpreter"], env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    errors = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(errors) == {"exp_filter", "exp_filter gradient", "decayed_attention", "decayed_attention gradient",
                           "decayed_attention per head", "exp_filter documents apart",
                           "exp_filter documents apart gradient", "decayed_attention documents apart",
                           "decayed_attention documents apart gradient", "wkv", "wkv gradient", "rwkv4 reference"}
    assert all(error < TOLERANCE for error in errors.values()), errors
