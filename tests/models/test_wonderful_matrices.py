"""The Wonderful Matrices hybrid beyond the conformance suite: SSD is its written recurrence
(and retention when dt is constant), attention sits at every r-th layer and only there does
the decoding state grow, the dynamic mask starts as plain attention, is cached with the
keys and folds into the fused causal kernel, product-key retrieval finds the true top experts, and sizes match MCSD's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from helpers.models import tiny_config, tiny_model
from helpers.runs import run_here
from omegaconf import DictConfig
from helpers.runs import TINY_SWEEP, sweep_dir

import mcsd
from mcsd.ops.context import ForwardContext
from mcsd import ConfigError, build_model, count_parameters
from mcsd.bench.decoding import state_bytes
from mcsd.models.modules.attention import CausalSelfAttention
from mcsd.ops.attention import KVCache, biased_mask, causal_attention
from mcsd.models.modules.rotary import rotary
from mcsd.models.wonderful_matrices import CrossDomainMoE, DynamicMaskAttention, StateSpaceDuality
from mcsd.ops.decayed_attention import decayed_attention

HYBRID = "wonderful_matrices/default+attention_every=2"


def literal_ssd(mixer: StateSpaceDuality, x: torch.Tensor, position: int) -> torch.Tensor:
    """S_t = exp(dt_t A) S_{t-1} + B_t^T (dt_t x_t), y_t = C_t S_t + skip x_t, gated norm, out:
    a token-by-token loop in float64 over the mixer's own weights."""
    batch, length, _ = x.shape
    heads, width, size = mixer.num_heads, mixer.head_width, mixer.state_size
    gate, inner, b, c, dt = (x @ mixer.in_proj.weight.T).split(mixer.split_widths, dim=-1)
    b, c = (rotary(t[:, None], position, mixer.rope_base)[:, 0] for t in (b, c))
    dt = F.softplus(dt + mixer.dt_bias)
    a = -torch.exp(mixer.A_log)
    inner = inner.view(batch, length, heads, width)
    state = torch.zeros(batch, heads, size, width, dtype=x.dtype)
    outputs = []
    for t in range(length):
        decay = torch.exp(dt[:, t] * a)[..., None, None]
        state = decay * state + b[:, t, None, :, None] * (dt[:, t, :, None] * inner[:, t])[:, :, None, :]
        outputs.append(torch.einsum("bn,bhnp->bhp", c[:, t], state) + mixer.skip[:, None] * inner[:, t])
    y = torch.stack(outputs, dim=1)  # [B, N, H, P]
    normed = y / (y.pow(2).mean(-1, keepdim=True) + mixer.norm.eps).sqrt() * mixer.norm.weight
    gated = normed * F.silu(gate.view(batch, length, heads, width))
    return gated.reshape(batch, length, -1) @ mixer.out_proj.weight.T


@torch.no_grad()
@pytest.mark.parametrize("form", ["parallel", "chunk", "recurrent"])
def test_ssd_is_the_written_recurrence(form: str) -> None:
    model = tiny_model("wonderful_matrices")
    mixer = model.layers[0].mixer.double()
    assert isinstance(mixer, StateSpaceDuality)
    x = torch.randn(2, 19, mixer.in_proj.in_features, dtype=torch.float64)
    actual, state = mixer(x, None, 3, model.context(form))
    assert torch.allclose(actual, literal_ssd(mixer, x, 3), atol=1e-10)
    assert state.shape == (2, mixer.num_heads, mixer.state_size, mixer.head_width) and state.dtype == torch.float64


@torch.no_grad()
def test_ssd_initialisation() -> None:
    config = tiny_config("wonderful_matrices")
    mixer = build_model(config).layers[0].mixer
    heads = mixer.num_heads
    assert torch.equal(mixer.A_log, torch.log(torch.arange(1.0, heads + 1)))
    assert torch.equal(mixer.skip, torch.ones(heads))
    dt = F.softplus(mixer.dt_bias)
    assert ((dt > 0.001 * (1 - 1e-5)) & (dt < 0.1 * (1 + 1e-5))).all()
    assert mixer.in_proj.out_features == 2 * 2 * 24 + 2 * 128 + heads  # z, x (expand 2), B, C (N = 128), dt


@torch.no_grad()
def test_constant_dt_is_retention() -> None:
    """With dt constant per head (dt_proj's rows zero), SSD's log-decay dt A is a fixed decay per
    head: its state and output are retention's with q = C, k = B, v = dt x and gamma = exp(dt A)."""
    model = tiny_model("wonderful_matrices")
    mixer = model.layers[0].mixer.double()
    heads, width = mixer.num_heads, mixer.head_width
    mixer.in_proj.weight[-heads:] = 0.0
    x = torch.randn(2, 40, mixer.in_proj.in_features, dtype=torch.float64)
    _, inner, b, c, _ = (x @ mixer.in_proj.weight.T).split(mixer.split_widths, dim=-1)
    dt = F.softplus(mixer.dt_bias)
    b, c = (rotary(t[:, None], 0, mixer.rope_base).expand(-1, heads, -1, -1) for t in (b, c))
    values = inner.view(2, 40, heads, width).transpose(1, 2) * dt[:, None, None]
    _, retention_state = decayed_attention(c, b, values, dt * -torch.exp(mixer.A_log),
            context=ForwardContext("parallel"))
    _, ssd_state = mixer(x, None, 0, model.context("chunk"))
    assert torch.allclose(ssd_state, retention_state, atol=1e-12)


def test_attention_layers_sit_at_every_rth_layer() -> None:
    for every, attention_layers in [(0, []), (2, [1, 3, 5]), (3, [2, 5]), (4, [3]), (8, [])]:
        model = tiny_model("wonderful_matrices", num_layers=6, attention_every=every)
        kinds = [isinstance(layer.mixer, CausalSelfAttention) for layer in model.layers]
        assert [index for index, kind in enumerate(kinds) if kind] == attention_layers, every
        assert all(isinstance(layer.mixer, StateSpaceDuality) for index, layer in enumerate(model.layers)
                   if index not in attention_layers)
    assert type(tiny_model(HYBRID).layers[1].mixer) is DynamicMaskAttention
    assert type(tiny_model(HYBRID, dynamic_mask=False).layers[1].mixer) is CausalSelfAttention


@torch.no_grad()
def test_decoding_state_grows_only_on_attention_layers() -> None:
    model = tiny_model("wonderful_matrices", num_layers=4, attention_every=2)
    sizes = {}
    for length in (10, 30):
        _, state = model.prefill(torch.randint(0, 101, (1, length)))
        sizes[length] = [state_bytes(layer.mixer) for layer in state.layers]
        assert [type(layer.mixer) for layer in state.layers] == [torch.Tensor, KVCache] * 2
    ssd = 24 // 3 * 2 * 3 * 128 * 4  # [H, N, P] fp32
    per_token = (2 * 24 + 3) * 4  # keys, values and the key bias per head
    assert sizes[10] == [ssd, 10 * per_token] * 2 and sizes[30] == [ssd, 30 * per_token] * 2


@torch.no_grad()
@pytest.mark.parametrize("form", ["parallel", "chunk", "recurrent"])
def test_dynamic_mask_starts_as_plain_attention(form: str) -> None:
    masked = tiny_model(HYBRID)
    plain = tiny_model(HYBRID, dynamic_mask=False)
    missing, unexpected = plain.load_state_dict(masked.state_dict(), strict=False)
    assert sorted(unexpected) == ["layers.1.mixer.A", "layers.1.mixer.dt_proj.weight"] and not missing
    input_ids = torch.randint(0, 101, (2, 37))
    torch.testing.assert_close(masked(input_ids, form=form), plain(input_ids, form=form), rtol=1e-5, atol=1e-5)
    masked.layers[1].mixer.A.fill_(-3.0)  # now the bias differs between keys
    masked.layers[1].mixer.dt_proj.weight.normal_(std=10.0)  # biases spread over (0, 1]
    x = torch.randn(2, 37, 24)
    biased, _ = masked.layers[1].mixer(x, None, 0, masked.context(form))
    unbiased, _ = plain.layers[1].mixer(x, None, 0, plain.context(form))
    assert (biased - unbiased).abs().max() > 0.1 * unbiased.abs().max()


@pytest.mark.parametrize("length", [1, 37])
def test_folded_key_bias_is_the_masked_attention(length: int) -> None:
    """causal_attention's bias folded into one more query/key feature gives the masked SDPA's
    outputs and gradients (every input's, the bias's too)."""
    inputs = [torch.randn(2, 3, length, 8, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    bias = torch.rand(2, 3, length, dtype=torch.float64, requires_grad=True)
    folded = causal_attention(*inputs, bias)
    masked = F.scaled_dot_product_attention(*inputs, attn_mask=biased_mask(bias, 0, length))
    torch.testing.assert_close(folded, masked, rtol=1e-12, atol=1e-12)
    weights = torch.randn_like(masked)
    for got, expected in zip(torch.autograd.grad((folded * weights).sum(), [*inputs, bias]),
                             torch.autograd.grad((masked * weights).sum(), [*inputs, bias])):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_biased_attention_layer_forms_agree() -> None:
    """With biases spread over (0, 1], the dynamic-mask layer's parallel and chunk forms from the
    start (the folded causal kernel) equal its recurrent form (a masked call per token), values
    and gradients."""
    model = tiny_model(HYBRID).double()
    attention = model.layers[1].mixer
    with torch.no_grad():
        attention.A.fill_(-3.0)
        attention.dt_proj.weight.normal_(std=10.0)
    x = torch.randn(2, 37, 24, dtype=torch.float64)
    outputs, grads = {}, {}
    for form in ("parallel", "chunk", "recurrent"):
        outputs[form], _ = attention(x, None, 0, model.context(form))
        grads[form] = torch.autograd.grad(outputs[form].square().sum(), list(attention.parameters()))
    for form in ("parallel", "chunk"):
        torch.testing.assert_close(outputs[form], outputs["recurrent"], rtol=1e-10, atol=1e-12)
        for got, expected in zip(grads[form], grads["recurrent"]):
            torch.testing.assert_close(got, expected, rtol=1e-8, atol=1e-10)


@torch.no_grad()
def test_dynamic_mask_bias_is_the_formula_and_cached_with_the_keys() -> None:
    model = tiny_model(HYBRID)
    attention = model.layers[1].mixer
    attention.A.copy_(torch.tensor([-1.0, -2.0, -0.5]))
    values = torch.randn(2, 3, 7, 8)
    dt = F.softplus(values.transpose(1, 2).reshape(2, 7, 24) @ attention.dt_proj.weight.T)
    expected = torch.exp(attention.A * dt).transpose(1, 2)
    assert torch.allclose(attention.key_bias(values), expected)
    input_ids = torch.randint(0, 101, (2, 12))
    _, state = model.prefill(input_ids)
    cache = state.layers[1].mixer
    assert cache.key_bias.shape == (2, 3, 12)
    assert torch.allclose(cache.key_bias, attention.key_bias(cache.values[:, :, :12]), atol=1e-6)
    cache.reserve(40, filled=12)  # growing keeps what was written, the biases too
    assert cache.capacity == 40 and cache.key_bias.shape == (2, 3, 40)


@torch.no_grad()
def test_product_keys_find_the_top_experts_of_all_pairs() -> None:
    """score(i * s + j) = q_1 . K1_i + q_2 . K2_j: the top k of the k x k best pairs are the top k
    of all s * s experts."""
    moe = tiny_model(HYBRID, mlp="cdmoe", cdmoe_experts=64, cdmoe_heads=2, cdmoe_top_k=4).layers[0].mlp
    assert isinstance(moe, CrossDomainMoE)
    phi = torch.randn(5, 24)
    scores, experts = moe.select(phi)
    queries = moe.queries(phi).view(5, 2, 2, moe.half_width)
    every = (torch.einsum("thw,hsw->ths", queries[:, :, 0], moe.sub_keys[:, 0])[..., :, None]
             + torch.einsum("thw,hsw->ths", queries[:, :, 1], moe.sub_keys[:, 1])[..., None, :]).flatten(-2)
    best, chosen = every.topk(4, dim=-1)
    assert torch.allclose(scores, best, atol=1e-6) and torch.equal(experts, chosen)


@torch.no_grad()
def test_cdmoe_is_the_listings_formula() -> None:
    moe = tiny_model(HYBRID, mlp="cdmoe", cdmoe_experts=16, cdmoe_top_k=3, cdmoe_heads=2).layers[1].mlp
    x = torch.randn(2, 5, 24)
    phi = F.silu(x @ moe.shared_up.weight.T) @ moe.shared_down.weight.T
    scores, experts = moe.select(phi)
    expected = phi.clone()
    for b in range(2):
        for t in range(5):
            for h in range(2):
                for k in range(3):
                    i = experts[b, t, h, k]
                    activation = F.silu((phi[b, t] @ moe.down_embed.weight[i]) * scores[b, t, h, k])
                    expected[b, t] += activation * moe.up_embed.weight[i]
    assert torch.allclose(moe(x), expected, atol=1e-6)


def test_cdmoe_reports_activated_parameters() -> None:
    config = tiny_config(HYBRID, mlp="cdmoe")
    model = build_model(config)
    total = sum(p.numel() for p in model.parameters())
    inactive = 2 * 24 * (1024 - 1 * 2)  # per layer: every expert's two vectors but the top 2
    assert model.activated_parameters() == total - 2 * inactive
    geglu = build_model(tiny_config(HYBRID))
    assert geglu.activated_parameters() == sum(p.numel() for p in geglu.parameters())


@pytest.mark.parametrize("size", ["tiny", "small", "base", "1.6b"])
def test_sizes_match_mcsd(size: str) -> None:
    from hydra import compose, initialize_config_module

    with initialize_config_module("mcsd.conf", version_base="1.3"):
        nodes = {name: compose("build", overrides=[f"model={name}", f"size={size}"]).model
                 for name in ("mcsd", "wonderful_matrices")}
        cdmoe = compose("build", overrides=["model=wonderful_matrices", f"size={size}", "model.mlp=cdmoe"]).model
    reference = count_parameters(nodes["mcsd"])
    assert abs(count_parameters(nodes["wonderful_matrices"]) / reference - 1) < 0.03
    with torch.device("meta"):
        hybrid, with_experts = build_model(nodes["wonderful_matrices"]), build_model(cdmoe)
    assert with_experts.config.mlp_hidden_size == hybrid.config.mlp_hidden_size  # sized with the GeGLU
    experts = 2 * 1024 * hybrid.config.hidden_size + 1 * 2 * 32 * 128  # expert vectors, sub-keys
    layers = hybrid.config.num_layers
    shared_minus_geglu = -hybrid.config.hidden_size * hybrid.config.mlp_hidden_size  # 2 D W vs 3 D W
    queries = hybrid.config.hidden_size * 256
    assert count_parameters(cdmoe) - count_parameters(nodes["wonderful_matrices"]) == \
        layers * (experts + shared_minus_geglu + queries)


@pytest.mark.parametrize(("override", "message"), [
    ({"attention_every": -1}, "model.attention_every=-1 must be an integer >= 0"),
    ({"mlp": "moe"}, "model.mlp='moe' is unknown: use one of geglu, cdmoe"),
    ({"cdmoe_experts": 1000}, "model.cdmoe_experts=1000 must be a square"),
    ({"cdmoe_experts": 4, "cdmoe_top_k": 3}, "model.cdmoe_experts=4 must be a square s \\* s with s >= model.cdmoe_top_k=3"),
    ({"state_size": 7}, "model.state_size=7 must be even"),
    ({"dt_min": 0.2}, "model.dt_min=0.2 and model.dt_max=0.1 must satisfy"),
    ({"dynamic_mask": "yes"}, "model.dynamic_mask='yes' must be true or false"),
])
def test_bad_settings_are_refused_in_one_line(override: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_model(tiny_config("wonderful_matrices", **override))



@pytest.mark.slow
def test_ablation_experiment_trains_its_four_arms(tmp_path: Path) -> None:
    """experiment=wm_ablation: SSD only, + attention, + dynamic mask, + CDMoE at one seed (4 layers so
    that the tiny model has an attention layer), each the model it names, plotted against SSD only."""
    result = run_here("mcsd-train", "-m", "experiment=wm_ablation", "size=tiny", "model.num_layers=4",
                     "hydra.sweeper.params.seed=0", *TINY_SWEEP, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = sweep_dir(tmp_path)
    jobs = sorted((path for path in sweep.iterdir() if path.is_dir()), key=lambda path: int(path.name))
    models = [mcsd.load(job / "model") for job in jobs]
    mixers = [[type(layer.mixer).__name__ for layer in model.layers] for model in models]
    ssd = "StateSpaceDuality"
    assert mixers == [[ssd] * 4, [ssd] * 3 + ["CausalSelfAttention"], [ssd] * 3 + ["DynamicMaskAttention"],
                      [ssd] * 3 + ["DynamicMaskAttention"]]
    assert [type(model.layers[0].mlp).__name__ for model in models] == ["GatedMLP"] * 3 + ["CrossDomainMoE"]
    configs = [yaml.safe_load((job / "csv" / "version_0" / "hparams.yaml").read_text()) for job in jobs]
    reference = count_parameters(tiny_size_node("mcsd"))
    assert all(abs(config["model/params"] / reference - 1) < 0.03 for config in configs[:3])
    assert configs[3]["model/params_activated"] < configs[3]["model/params"]
    assert [config["model/params_activated"] == config["model/params"] for config in configs] == [True] * 3 + [False]
    plotted = run_here("mcsd-plot", "ablation", f"source={sweep}", "name=wm_ablation",
                      "reference='Wonderful Matrices default, attention_every=0'", cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr[-2000:]
    table = (sweep / "wm_ablation_by_seed.md").read_text()
    for label in ("Wonderful Matrices default, attention_every=0", "Wonderful Matrices default, dynamic_mask=False",
                  "Wonderful Matrices |", "Wonderful Matrices default, mlp=cdmoe"):
        assert f"| {label}" in table, label


def tiny_size_node(name: str) -> DictConfig:
    from hydra import compose, initialize_config_module

    with initialize_config_module("mcsd.conf", version_base="1.3"):
        return compose("build", overrides=[f"model={name}", "size=tiny", "model.num_layers=4"]).model
