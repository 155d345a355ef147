"""fla's fused recurrent kernels run in Triton's interpreter on the CPU, through the adapters,
against this project's parallel forms: ``TRITON_INTERPRET=1 python -m helpers.fla_interpreter``
(from ``tests/``) prints one JSON line of relative RMS errors. The interpreter cannot time a
kernel, so the autotuner's timings are stood in for (every configuration ties: its first runs)."""

from __future__ import annotations

import json
import os

import torch
import triton.runtime.autotuner as autotuner

from helpers.fla_references import naive_recurrent_rwkv4
from helpers.models import relative_rms_error
from mcsd.ops.decayed_attention import fla_decayed_attention, parallel_decayed_attention
from mcsd.ops.exp_filter import fla_exp_filter, parallel_exp_filter
from mcsd.ops.wkv import fla_wkv, parallel_wkv


def _tied_timings(self: autotuner.Autotuner):
    return lambda kernel_call, quantiles=None, **kwargs: [1.0, 1.0, 1.0]


def gradient_error(got: torch.Tensor, expected: torch.Tensor, got_inputs: list, expected_inputs: list) -> float:
    cotangent = torch.randn(got.shape, generator=torch.Generator().manual_seed(1))
    got_gradients = torch.autograd.grad((got * cotangent).sum(), got_inputs)
    expected_gradients = torch.autograd.grad((expected * cotangent.double()).sum(), expected_inputs)
    return max(relative_rms_error(a, b) for a, b in zip(got_gradients, expected_gradients))


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    autotuner.Autotuner.do_bench = property(_tied_timings)
    from fla.ops.hgrn import fused_recurrent_hgrn
    from fla.ops.rwkv4 import fused_recurrent_rwkv4
    from fla.ops.simple_gla import fused_recurrent_simple_gla

    torch.manual_seed(0)
    errors = {}
    length = 65
    x = torch.randn(2, 3, length, 4, requires_grad=True)
    log_decay = torch.log(torch.tensor([0.5, 0.9, 0.999]))
    initial = torch.randn(2, 3, 4)
    got = fla_exp_filter(x, log_decay, initial, "recurrent", kernel=fused_recurrent_hgrn)
    x64 = x.detach().double().requires_grad_()
    expected = parallel_exp_filter(x64, log_decay.double(), initial.double())
    errors["exp_filter"] = max(relative_rms_error(a, b) for a, b in zip(got, expected))
    errors["exp_filter gradient"] = gradient_error(got[0], expected[0], [x], [x64])

    q, k = torch.randn(2, 3, length, 4, requires_grad=True), torch.randn(2, 3, length, 4, requires_grad=True)
    v = torch.randn(2, 3, length, 5, requires_grad=True)
    per_token = (-torch.rand(2, 3, length) * 0.5).requires_grad_()
    state = torch.randn(2, 3, 4, 5)
    got = fla_decayed_attention(q, k, v, per_token, state, "recurrent", kernel=fused_recurrent_simple_gla)
    leaves64 = [tensor.detach().double().requires_grad_() for tensor in (q, k, v, per_token)]
    expected = parallel_decayed_attention(*leaves64, state.double())
    errors["decayed_attention"] = max(relative_rms_error(a, b) for a, b in zip(got, expected))
    errors["decayed_attention gradient"] = gradient_error(got[0], expected[0], [q, k, v, per_token], leaves64)
    head_decay = torch.log1p(-(2.0 ** -torch.arange(5.0, 8.0)))  # RetNet's, through fla's g_gamma
    got = fla_decayed_attention(q, k, v, head_decay, state, "recurrent", kernel=fused_recurrent_simple_gla)
    expected = parallel_decayed_attention(*leaves64[:3], head_decay.double(), state.double())
    errors["decayed_attention per head"] = max(relative_rms_error(a, b) for a, b in zip(got, expected))

    # Documents apart: HGRN's gate at -inf at each start, simple GLA's variable-length sequences
    starts = torch.zeros(2, length, dtype=torch.bool)
    starts[0, [0, 1, 3, 40]] = True
    starts[1, 20] = True  # row 1's first document goes on from its initial state
    got = fla_exp_filter(x, log_decay, initial, "recurrent", kernel=fused_recurrent_hgrn, starts=starts)
    expected = parallel_exp_filter(x64, log_decay.double(), initial.double(), starts)
    errors["exp_filter documents apart"] = max(relative_rms_error(a, b) for a, b in zip(got, expected))
    errors["exp_filter documents apart gradient"] = gradient_error(got[0], expected[0], [x], [x64])
    state = torch.randn(2, 3, 4, 5)
    got = fla_decayed_attention(q, k, v, per_token, state, "recurrent", kernel=fused_recurrent_simple_gla,
                                starts=starts)
    leaves64 = [tensor.detach().double().requires_grad_() for tensor in (q, k, v, per_token)]
    expected = parallel_decayed_attention(*leaves64, state.double(), starts)
    errors["decayed_attention documents apart"] = max(relative_rms_error(a, b) for a, b in zip(got, expected))
    errors["decayed_attention documents apart gradient"] = gradient_error(got[0], expected[0], [q, k, v, per_token],
                                                                          leaves64)

    w, u = torch.rand(8) + 0.05, torch.randn(8)
    k, v = torch.randn(2, length, 8, requires_grad=True), torch.randn(2, length, 8, requires_grad=True)
    state = parallel_wkv(w, u, torch.randn(2, 5, 8), torch.randn(2, 5, 8))[1]
    got = fla_wkv(w, u, k, v, state, kernel=fused_recurrent_rwkv4)
    leaves64 = [k.detach().double().requires_grad_(), v.detach().double().requires_grad_()]
    expected = parallel_wkv(w.double(), u.double(), *leaves64, state.double())
    errors["wkv"] = relative_rms_error(got[0], expected[0])
    errors["wkv gradient"] = gradient_error(got[0], expected[0], [k, v], leaves64)
    fla_state = state[:, :, None]
    kernel_output = fused_recurrent_rwkv4(torch.log(w), u, k.detach(), v.detach(), fla_state)
    reference_output = naive_recurrent_rwkv4(torch.log(w), u, k.detach(), v.detach(), fla_state)
    errors["rwkv4 reference"] = max(relative_rms_error(a, b) for a, b in zip(kernel_output, reference_output))
    print(json.dumps(errors))


if __name__ == "__main__":
    main()
