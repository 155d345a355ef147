"""MCSD's three switches beyond the paper (issue 90), each against a reference written here:
the short convolution is a depthwise ``conv1d`` then SiLU, the input-dependent decay is the sum
``sum_{j<n} (prod_{j<r<=n} alpha_r) E_j`` written as a loop and starts as the fixed decay, and the
hybrid puts the Transformer's attention at every ``attention_every``-th layer. The conformance
suite runs each registered variant through every form; these tests make the switches matter
(trained-looking gate weights, documents apart) and check their refusals, and RetNet's switches'
refusals (their formula: tests/models/test_architectures.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.models import decode_all, relative_rms_error, tiny_config, tiny_model

from mcsd import build_model
from mcsd.models.config import ConfigError
from mcsd.models.mcsd.block import MCSDBlock
from mcsd.models.modules.attention import CausalSelfAttention
from mcsd.ops.attention import KVCache
from mcsd.models.modules.conv import ShortConvolution


@torch.no_grad()
def test_the_short_convolution_is_a_causal_depthwise_conv1d_then_silu() -> None:
    torch.manual_seed(0)
    conv = ShortConvolution(6, 4)
    conv.reset_parameters()
    x = torch.randn(2, 11, 6)
    # conv1d correlates: tap t of its kernel meets input n - (K - 1) + t, so our weight (t back) is flipped.
    expected = F.silu(F.conv1d(F.pad(x.transpose(1, 2), (3, 0)), conv.weight.flip(-1)[:, None], groups=6))
    y, state = conv(x, None)
    assert relative_rms_error(y, expected.transpose(1, 2)) < 1e-6
    assert torch.equal(state, x[:, -3:])
    # Split anywhere, or one token at a time: the same outputs.
    first, state = conv(x[:, :5], None)
    rest, _ = conv(x[:, 5:], state)
    assert relative_rms_error(torch.cat([first, rest], 1), y) < 1e-6
    state, steps = None, []
    for n in range(11):
        out, state = conv.step(x[:, n], state)
        steps.append(out)
    assert relative_rms_error(torch.stack(steps, 1), y) < 1e-6


@torch.no_grad()
def test_the_short_convolution_keeps_documents_apart() -> None:
    """Packed documents of 5 and 2 tokens: each gets what it gets alone, and the state is the last
    document's inputs, zeros before its start."""
    torch.manual_seed(1)
    conv = ShortConvolution(3, 4)
    conv.reset_parameters()
    x = torch.randn(1, 7, 3)
    y, state = conv(x, None, position_ids=torch.tensor([[0, 1, 2, 3, 4, 0, 1]]))
    assert relative_rms_error(y[:, :5], conv(x[:, :5], None)[0]) < 1e-6
    alone, alone_state = conv(x[:, 5:], None)
    assert relative_rms_error(y[:, 5:], alone) < 1e-6
    assert torch.equal(state, alone_state) and torch.equal(state[:, 0], torch.zeros(1, 3))


def loop_history(log_decay: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The input-decay history by its definition: row 0 the token itself, row n the sum over
    j < n of ``values[j]`` times the decays of tokens j+1..n. ``log_decay`` ``[N, C]``, ``values``
    ``[N, C, Dc]``."""
    rows = [values[0]]
    for n in range(1, values.shape[0]):
        rows.append(sum(torch.exp(log_decay[j + 1:n + 1].sum(0))[:, None] * values[j] for j in range(n)))
    return torch.stack(rows)


def randomise_decay_gates(model: torch.nn.Module, scale: float = 0.5) -> None:
    """Gate weights as training leaves them (non-zero): each token's decays differ."""
    generator = torch.Generator().manual_seed(5)
    for module in model.modules():
        if isinstance(module, MCSDBlock):
            for section in module.sections:
                if section.decay_gate is not None:
                    section.decay_gate.weight.copy_(torch.randn(section.decay_gate.weight.shape, generator=generator)
                                                    * scale)


@torch.no_grad()
def test_the_input_decay_history_is_its_definition_in_every_form() -> None:
    torch.manual_seed(2)
    model = tiny_model("mcsd/input_decay")
    randomise_decay_gates(model)
    block = model.layers[0].mixer
    section = block.sections[1]
    x = torch.randn(1, 9, 24)
    history = block.section_inputs(x)[1][1]  # [1, N, C, Dc]
    log_decay = section.log_decay(x)  # [1, N, C]
    assert log_decay[0].std(0).min() > 0.01  # the decays differ from token to token
    expected = loop_history(log_decay[0].double(), history[0].double())
    for form in ("parallel", "chunk", "recurrent"):
        mixed, state = block.gated_history(log_decay, history, None, 0, model.context(form))
        assert relative_rms_error(mixed[0], expected) < 1e-6, form
    # The state continues the sum: 4 tokens, then 5 from its state, as the 9 at once.
    first, state = block.gated_history(log_decay[:, :4], history[:, :4], None, 0, model.context("chunk"))
    rest, _ = block.gated_history(log_decay[:, 4:], history[:, 4:], state, 4, model.context("chunk"))
    assert relative_rms_error(torch.cat([first, rest], 1)[0], expected) < 1e-6


@torch.no_grad()
def test_the_input_decay_starts_as_the_papers_block_and_its_gate_learns() -> None:
    """At initialisation (gate weights 0, biases logit(alpha_i)) the model is the full block's with
    the same weights; with gate weights of a trained model its forms and decoding still agree, its
    output differs, and the gate's weights get a gradient."""
    torch.manual_seed(3)
    gated = tiny_model("mcsd/input_decay")
    full = build_model(tiny_config("mcsd/full"))
    missing, unexpected = full.load_state_dict(gated.state_dict(), strict=False)
    assert not missing and all("decay_gate" in key for key in unexpected) and unexpected
    input_ids = torch.randint(0, 101, (2, 40))
    assert relative_rms_error(gated(input_ids), full(input_ids)) < 1e-6
    randomise_decay_gates(gated)
    reference = gated(input_ids, form="parallel")
    assert relative_rms_error(reference, full(input_ids)) > 1e-3  # the gate moves the output (round-off: 1e-7)
    for form in ("chunk", "recurrent"):
        assert relative_rms_error(gated(input_ids, form=form), reference) < 1e-5, form
    assert relative_rms_error(decode_all(gated, input_ids, split=7), reference[:, 6:]) < 1e-5
    with torch.enable_grad():
        gated(input_ids).square().mean().backward()
    assert all(section.decay_gate.weight.grad.abs().sum() > 0 for layer in gated.layers
               for section in layer.mixer.sections if section.decay_gate is not None)


@torch.no_grad()
def test_the_hybrid_switch_puts_attention_at_every_kth_layer() -> None:
    model = tiny_model("mcsd/hybrid_attention", num_layers=4)
    kinds = [type(layer.mixer) for layer in model.layers]
    assert kinds == [MCSDBlock, CausalSelfAttention, MCSDBlock, CausalSelfAttention]
    _, state = model.decoding().prefill(torch.randint(0, 101, (1, 5)))
    assert [isinstance(layer.mixer, KVCache) for layer in state.layers] == [False, True, False, True]
    assert [type(layer.mixer) for layer in tiny_model("mcsd/full", num_layers=4).layers] == [MCSDBlock] * 4


@pytest.mark.parametrize(("fields", "message"), [
    ({"short_conv": -1}, "model.short_conv=-1 must be an integer >= 0"),
    ({"input_decay": True, "sections": ["slope"]}, "model.input_decay=true changes the decay sections, and "
                                                   "model.sections=['slope'] has none"),
    ({"input_decay": True, "decay_norm": "sum"}, "set model.decay_norm=rmsnorm (or model.input_decay=false)"),
    ({"input_decay": "yes"}, "model.input_decay='yes' must be true or false"),
    ({"attention_every": -2}, "model.attention_every=-2 must be an integer >= 0"),
    ({"attention_every": 2, "hidden_size": 9}, "gives heads of 3 features"),
])
def test_the_switches_refuse_what_cannot_work_in_one_line(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        build_model(tiny_config("mcsd/full", **fields))
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(("fields", "message"), [
    ({"short_conv": 2.5}, "model.short_conv=2.5 must be an integer >= 0"),
    ({"rope": "no"}, "model.rope='no' must be true or false"),
    ({"decay_offset": 0}, "model.decay_offset=0 must be positive"),
])
def test_retnets_switches_refuse_what_cannot_work_in_one_line(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        build_model(tiny_config("retnet", **fields))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_retnet_without_rope_takes_any_head_width() -> None:
    """RoPE's even head width is asked only with RoPE on."""
    assert build_model(tiny_config("retnet", rope=False, hidden_size=9)).layers[0].mixer.key_width == 3
    with pytest.raises(ConfigError, match="gives heads of 3 features"):
        build_model(tiny_config("retnet", hidden_size=9))


def test_a_sweep_told_a_switch_of_another_architecture_is_shown_where_it_goes(capsys: pytest.CaptureFixture) -> None:
    """``mcsd-train -m ... registry_architectures=[retnet] model.rope=false``: Hydra composes the
    default model (MCSD, no ``rope``) before any arm and would fail in several lines; the key check
    says in one which architecture holds it and how to give it to that one's arms alone. A key no
    architecture has is refused as before."""
    from mcsd.commands.app import check_keys_exist

    with pytest.raises(SystemExit):
        check_keys_exist("mcsd-train", "train", ["-m", "experiment=mqar_recall", "hydra.sweeper.registry_architectures=[retnet]",
                                              "model.rope=false"])
    assert ("model.rope=false: rope is a setting of retnet, not of the model the sweep composes first: give it to "
            "those arms alone, \"+hydra.sweeper.registry_settings.retnet=['model.rope=false']\"") in capsys.readouterr().err
    with pytest.raises(SystemExit):
        check_keys_exist("mcsd-train", "train", ["-m", "model.ropez=false"])
    assert "ropez is not a setting of model" in capsys.readouterr().err
