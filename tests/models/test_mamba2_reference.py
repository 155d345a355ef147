"""Our Mamba-2 layer against an independent one: transformers' ``Mamba2Mixer`` (its pure-PyTorch
path, the one it runs on a CPU), given the same weights. Mamba-2 stays at chance on MQAR at every
rate (experiments/mqar_recall/README.md); these tests say whether that is our layer or the layer."""

from __future__ import annotations

import pytest
import torch

from helpers.models import relative_rms_error, tiny_config, tiny_model
from mcsd.models import registry
from mcsd.models.build import build_model
from mcsd.models.config import ConfigError
from mcsd.models.mamba2.ssd import Mamba2Mixer
from mcsd.ops.context import ForwardContext

transformers_mamba2 = pytest.importorskip("transformers.models.mamba2.modeling_mamba2")
from transformers import Mamba2Config as TransformersMamba2Config  # noqa: E402

# transformers' gated norm computes in fp32 whatever the inputs' dtype: fp32 round-off is what remains.
FP32_TOLERANCE = 2e-6


def their_mixer(ours: Mamba2Mixer, hidden_size: int, chunk_size: int) -> torch.nn.Module:
    """transformers' layer with ``ours``'s sizes and weights: its convolution without a bias (ours
    has none), its taps in Conv1d's order (oldest first, ours newest first)."""
    config = TransformersMamba2Config(
        hidden_size=hidden_size, num_heads=ours.num_heads, head_dim=ours.head_width, state_size=ours.state_size,
        expand=ours.inner_width // hidden_size, n_groups=1, conv_kernel=ours.conv.kernel_size,
        use_conv_bias=False, use_bias=False, layer_norm_epsilon=ours.norm.eps, chunk_size=chunk_size,
        time_step_limit=(0.0, float("inf")), num_hidden_layers=1, vocab_size=16)
    theirs = transformers_mamba2.Mamba2Mixer(config, layer_idx=0)
    with torch.no_grad():
        theirs.in_proj.weight.copy_(ours.in_proj.weight)
        theirs.conv1d.weight.copy_(ours.conv.weight.flip(-1)[:, None, :])
        theirs.dt_bias.copy_(ours.dt_bias)
        theirs.A_log.copy_(ours.A_log)
        theirs.D.copy_(ours.skip)
        theirs.norm.weight.copy_(ours.norm.weight[0])
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
    return theirs.eval()


@pytest.mark.parametrize("skip", ["drawn", "none"])
@pytest.mark.parametrize("length", [7, 40])
@pytest.mark.parametrize("form", registry.get("mamba2").forms)
@torch.no_grad()
def test_our_layer_equals_transformers_mamba2_given_the_same_weights(form: str, length: int, skip: str) -> None:
    """Every form of our layer, freshly initialised as ours draws it (A in [1, 16], dt's bias), on
    inputs of the scale a layer sees, equals transformers' layer (its chunked scan over chunks of 16:
    40 tokens are three, the last padded) to fp32 round-off; also with the skip ``D x`` at zero, where
    the output is the SSD's alone (at initialisation the skip is most of it: dt scales the values)."""
    torch.manual_seed(0)
    model = tiny_model("mamba2", hidden_size=32, num_channels=4, state_size=8)
    ours = model.layers[0].mixer
    if skip == "none":
        ours.skip.zero_()
    theirs = their_mixer(ours, hidden_size=32, chunk_size=16)
    x = torch.randn(2, length, 32)
    actual, _ = ours(x, None, 0, ForwardContext.of(form, chunk_size=16))
    assert relative_rms_error(actual, theirs(x)) < FP32_TOLERANCE, form
    if skip == "none":  # not equal by construction: the SSD's output moves with its decays
        theirs.A_log.add_(1.0)
        assert relative_rms_error(actual, theirs(x)) > 1e-2


@torch.no_grad()
def test_our_prefill_and_steps_equal_transformers_layer() -> None:
    """A prefill of 9 tokens, then 3 tokens one at a time through our step (the convolution's and the
    SSD's carried states): transformers' layer's outputs over the 12 tokens in one call."""
    torch.manual_seed(1)
    model = tiny_model("mamba2", hidden_size=32, num_channels=4, state_size=8)
    ours = model.layers[0].mixer
    theirs = their_mixer(ours, hidden_size=32, chunk_size=16)
    x = torch.randn(2, 12, 32)
    expected = theirs(x)
    prefill, state = ours(x[:, :9], None, 0, ForwardContext.of("chunk", chunk_size=16))
    steps = []
    for position in range(9, 12):
        out, state = ours.step(x[:, position], state, position, ForwardContext.step())
        steps.append(out)
    assert relative_rms_error(torch.cat([prefill, torch.stack(steps, 1)], 1), expected) < FP32_TOLERANCE


@pytest.mark.parametrize(("override", "message"), [
    ({"in_proj_init": "xavier"}, "model.in_proj_init='xavier' is unknown: use one of normal, uniform"),
    ({"skip_init": "one"}, "model.skip_init='one' must be a number"),
])
def test_bad_initialisation_settings_are_refused_in_one_line(override: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_model(tiny_config("mamba2", **override))


@torch.no_grad()
def test_the_initialisation_settings_draw_what_they_say() -> None:
    """``in_proj_init=uniform``: nn.Linear's own bound 1/sqrt(D), reached and not passed; ``skip_init``: D."""
    torch.manual_seed(0)
    uniform = tiny_model("mamba2", hidden_size=64, num_channels=4, in_proj_init="uniform", skip_init=0.0).layers[0].mixer
    normal = tiny_model("mamba2", hidden_size=64, num_channels=4).layers[0].mixer
    bound = 1 / 64 ** 0.5
    assert bound * 0.99 < uniform.in_proj.weight.abs().max() <= bound
    assert abs(uniform.in_proj.weight.std().item() - bound / 3 ** 0.5) < 0.002
    assert abs(normal.in_proj.weight.std().item() - 0.02) < 0.001
    assert torch.equal(uniform.skip, torch.zeros(4)) and torch.equal(normal.skip, torch.ones(4))
