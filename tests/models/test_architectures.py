"""What is particular to each built-in architecture: MCSD's decoding state is fixed-size fp32;
the Transformer trains through one causal SDPA call per layer, and its KV cache is written
in place and grows geometrically when it is full."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers.models import relative_rms_error, tiny_model
from mcsd.models.transformer import rotary


@torch.no_grad()
def test_mcsd_state_is_fixed_size_fp32() -> None:
    model = tiny_model("mcsd")
    _, short = model.prefill(torch.randint(0, 101, (2, 5)))
    _, long = model.prefill(torch.randint(0, 101, (2, 500)))
    assert [s.shape for layer in short.layers for s in layer.mixer] == [
        s.shape for layer in long.layers for s in layer.mixer]
    assert all(s.shape == (2, 3, 8) and s.dtype == torch.float32 for layer in long.layers for s in layer.mixer)
    assert all(layer.mlp is None for layer in long.layers)  # the GeGLU MLP keeps no state


@torch.no_grad()
def test_kv_cache_is_preallocated_and_written_in_place() -> None:
    model = tiny_model("transformer")
    _, state = model.prefill(torch.randint(0, 101, (2, 10)), max_new_tokens=5)
    cache = state.layers[0].mixer
    storage = cache.keys.data_ptr()
    assert cache.keys.shape == (2, 3, 15, 8)
    for _ in range(5):
        _, state = model.step(torch.zeros(2, dtype=torch.long), state)
    assert state.layers[0].mixer.keys.data_ptr() == storage and state.position == 15


@torch.no_grad()
def test_kv_cache_grows_geometrically_without_a_hint() -> None:
    """300 steps after a 10-token prefill reallocate the cache 5 times (10 -> 20 -> ... -> 320),
    not once per token, and keep every key written before."""
    model = tiny_model("transformer")
    input_ids = torch.randint(0, 101, (2, 310))
    _, state = model.prefill(input_ids[:, :10])
    capacities = [state.layers[0].mixer.capacity]
    for position in range(10, 310):
        _, state = model.step(input_ids[:, position], state)
        if state.layers[0].mixer.capacity != capacities[-1]:
            capacities.append(state.layers[0].mixer.capacity)
    assert capacities == [10, 20, 40, 80, 160, 320]
    _, whole = model.prefill(input_ids)
    for grown, expected in ((g.mixer, e.mixer) for g, e in zip(state.layers, whole.layers)):
        assert relative_rms_error(grown.keys[:, :, :310], expected.keys) < 1e-6
        assert relative_rms_error(grown.values[:, :, :310], expected.values) < 1e-6


def test_transformer_trains_through_one_causal_sdpa_call_per_layer(monkeypatch) -> None:
    """No mask tensor (which would rule out the flash kernels on a GPU): ``is_causal=True``."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        calls.append((args[0].shape, kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    model = tiny_model("transformer").train()
    model(torch.randint(0, 101, (2, 200))).sum().backward()
    assert model.default_form == "parallel"
    assert calls == [(torch.Size([2, 3, 200, 8]), None, True)] * 2  # one per layer, the whole sequence


@torch.no_grad()
def test_retention_is_the_written_formula() -> None:
    """RetNet's mixer: o_n = sum_{m<=n} gamma_h^(n-m) (q_n . k_m) v_m with gamma_h = 1 - 2^(-5-h),
    q and k rotated at their positions, k / sqrt(dk); out = W_O(swish(G) * RMSNorm_head(o) * gain)."""
    model = tiny_model("retnet")
    mixer = model.layers[0].mixer.double()
    heads, key_width, value_width = mixer.num_heads, mixer.key_width, mixer.value_width
    x = torch.randn(2, 9, heads * key_width, dtype=torch.float64)
    q, k = (x @ weight.T for weight in mixer.qk_proj.weight.chunk(2))
    v, g = (x @ weight.T for weight in mixer.vg_proj.weight.chunk(2))
    q, k = (rotary(t.view(2, 9, heads, key_width).transpose(1, 2), 5, mixer.rope_base) for t in (q, k))
    k = k / key_width**0.5
    v = v.view(2, 9, heads, value_width).transpose(1, 2)
    o = torch.zeros_like(v)
    for h in range(heads):
        gamma = 1 - 2.0 ** (-5 - h)
        for n in range(9):
            for m in range(n + 1):
                o[:, h, n] += gamma ** (n - m) * (q[:, h, n] * k[:, h, m]).sum(-1, keepdim=True) * v[:, h, m]
    o = o.transpose(1, 2)
    normed = o / (o.pow(2).mean(-1, keepdim=True) + mixer.norm.eps).sqrt() * mixer.norm.weight
    expected = (normed * F.silu(g.view(2, 9, heads, value_width))).reshape(2, 9, -1) @ mixer.out_proj.weight.T
    actual, state = mixer(x, None, 5, model.context("parallel"))
    assert torch.allclose(actual, expected, atol=1e-10) and state.shape == (2, heads, key_width, value_width)


@torch.no_grad()
def test_retention_with_its_parts_switched_off_is_the_written_formula() -> None:
    """RetNet with no RoPE, no per-head norm, no gate and decays 1 - 2^(-2-h) (the switches of
    issue 90's study): out = W_O(o), o_n = sum_{m<=n} gamma_h^(n-m) (q_n . k_m / sqrt(dk)) v_m
    with q and k as projected; each switch alone changes the default model's output."""
    bare = dict(rope=False, retention_norm=False, output_gate=False, decay_offset=2.0)
    model = tiny_model("retnet", **bare)
    mixer = model.layers[0].mixer.double()
    assert mixer.norm is None and mixer.vg_proj.out_features == mixer.num_heads * mixer.value_width
    heads, key_width, value_width = mixer.num_heads, mixer.key_width, mixer.value_width
    x = torch.randn(2, 9, heads * key_width, dtype=torch.float64)
    q, k = (x @ weight.T for weight in mixer.qk_proj.weight.chunk(2))
    q, k = (t.view(2, 9, heads, key_width).transpose(1, 2) for t in (q, k))
    v = (x @ mixer.vg_proj.weight.T).view(2, 9, heads, value_width).transpose(1, 2)
    o = torch.zeros_like(v)
    for h in range(heads):
        gamma = 1 - 2.0 ** (-2 - h)
        for n in range(9):
            for m in range(n + 1):
                o[:, h, n] += gamma ** (n - m) * (q[:, h, n] * k[:, h, m]).sum(-1, keepdim=True) / key_width**0.5 * v[:, h, m]
    expected = o.transpose(1, 2).reshape(2, 9, -1) @ mixer.out_proj.weight.T
    for form in ("parallel", "chunk", "recurrent"):
        actual, _ = mixer(x, None, 5, model.context(form))
        assert torch.allclose(actual, expected, atol=1e-10), form
    input_ids = torch.randint(0, 101, (2, 30))
    torch.manual_seed(0)
    reference = tiny_model("retnet")(input_ids)
    for switch in ({"rope": False}, {"retention_norm": False}, {"decay_offset": 2.0}, {"short_conv": 4}):
        torch.manual_seed(0)  # the same weights where the switch leaves them
        assert not torch.allclose(tiny_model("retnet", **switch)(input_ids), reference, atol=1e-4), switch
