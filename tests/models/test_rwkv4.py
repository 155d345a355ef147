"""RWKV-4's own behaviour beyond the conformance suite: its initialisation, and the
multiple-temporal-perspectives switch (P = 1 is RWKV-4; identical mixes give RWKV-4's logits;
P adds only its mixes and W_agg; the decoding state is P times larger)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import mcsd
from helpers.models import tiny_config, tiny_model
from helpers.runs import FAST, compose_train
from mcsd import ConfigError, build_model, count_parameters
from mcsd.errors import MCSDError
from mcsd.training.run import train
from mcsd.training.module import LanguageModelModule
from mcsd.models.rwkv4.perspectives import Perspectives

TIME_MIXES = ("mix_k", "mix_v", "mix_r")


@pytest.mark.parametrize("num_layers", [1, 3])
def test_initialisation_is_rwkv4s(num_layers: int) -> None:
    model = tiny_model("rwkv4", num_layers=num_layers)
    width = model.config.hidden_size
    for index, layer in enumerate(model.layers):
        r01 = index / (num_layers - 1) if num_layers > 1 else 0.0
        r10 = 1 - index / num_layers
        for c in range(width):
            expected_decay = -5 + 8 * (c / (width - 1)) ** (0.7 + 1.3 * r01)
            expected_first = math.log(0.3) + 0.5 * ((c + 1) % 3 - 1)
            assert layer.mixer.time_decay[c].item() == pytest.approx(expected_decay, abs=1e-6)
            assert layer.mixer.time_first[c].item() == pytest.approx(expected_first, abs=1e-6)
            assert layer.mixer.mix_k[0, c].item() == pytest.approx((c / width) ** r10, abs=1e-6)
            assert layer.mixer.mix_v[0, c].item() == pytest.approx((c / width) ** r10 + 0.3 * r01, abs=1e-6)
            assert layer.mixer.mix_r[0, c].item() == pytest.approx((c / width) ** (0.5 * r10), abs=1e-6)
            assert layer.mlp.mix_k[0, c].item() == pytest.approx((c / width) ** r10, abs=1e-6)
            assert layer.mlp.mix_r[0, c].item() == pytest.approx((c / width) ** r10, abs=1e-6)


def test_one_perspective_is_rwkv4_with_no_extra_parameters() -> None:
    plain = build_model({key: value for key, value in tiny_config("rwkv4").items() if key != "perspectives"})
    one = tiny_model("rwkv4", perspectives=1)
    assert plain.state_dict().keys() == one.state_dict().keys()
    assert not any(key.startswith("streams.") for key in one.state_dict())


@pytest.mark.parametrize("perspectives", [2, 3])
def test_perspectives_add_only_their_mixes_and_aggregator(perspectives: int) -> None:
    config = tiny_config("rwkv4", perspectives=perspectives, equal_params_to="mcsd")
    one = build_model({**config, "perspectives": 1})
    many = build_model(config)
    assert many.config.mlp_hidden_size == one.config.mlp_hidden_size
    width, layers = one.config.hidden_size, one.config.num_layers
    added = (perspectives - 1) * 5 * width * layers + perspectives * (width + 1)
    assert count_parameters(config) - count_parameters({**config, "perspectives": 1}) == added


@pytest.mark.parametrize("form", ["parallel", "chunk", "recurrent"])
def test_identical_mixes_give_rwkv4s_logits(form: str) -> None:
    one = tiny_model("rwkv4")
    many = tiny_model("rwkv4", perspectives=3)
    many.streams.aggregator.weight.data.normal_(std=1.0)  # any weights: they sum to one
    missing, unexpected = many.load_state_dict(one.state_dict(), strict=False)  # mu copied to every row
    assert sorted(missing) == ["streams.aggregator.bias", "streams.aggregator.weight"] and not unexpected
    for name in TIME_MIXES:
        assert torch.equal(getattr(many.layers[1].mixer, name), getattr(one.layers[1].mixer, name).expand(3, -1))
    input_ids = torch.randint(0, 101, (2, 37))
    torch.testing.assert_close(many(input_ids, form=form), one(input_ids, form=form), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("perspectives", [1, 2])
def test_mixes_saved_as_vectors_load(perspectives: int) -> None:
    """RWKV-4 models saved before the switch hold each mix as [D]: the one perspective's row."""
    one = tiny_model("rwkv4")
    legacy = {key: value[0] if ".mix_" in key else value for key, value in one.state_dict().items()}
    model = tiny_model("rwkv4", perspectives=perspectives)
    model.load_state_dict(legacy, strict=perspectives == 1)
    assert torch.equal(model.layers[0].mlp.mix_r, one.layers[0].mlp.mix_r.expand(perspectives, -1))


def test_different_mixes_change_the_logits_and_weights_sum_to_one() -> None:
    many = tiny_model("rwkv4", perspectives=2)
    many.streams.aggregator.weight.data.normal_(std=1.0)
    input_ids = torch.randint(0, 101, (2, 20))
    before = many(input_ids)
    with torch.no_grad():
        many.layers[0].mixer.mix_k[1] = 1.0 - many.layers[0].mixer.mix_k[1]
    assert (many(input_ids) - before).abs().max() > 1e-4
    hidden = torch.randn(2 * 2, 20, many.config.hidden_size)
    weights = many.streams.weights(hidden)
    assert weights.shape == (2, 20, 2)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 20))
    assert (weights[..., 0] - 0.5).abs().max() > 1e-3  # the weights depend on the position's states


def test_merge_is_the_weighted_sum_of_the_streams() -> None:
    perspectives = Perspectives(count=3, width=4, init_std=0.5)
    perspectives.reset_parameters()
    hidden = torch.randn(3 * 2, 5, 4)
    streams = hidden.reshape(3, 2, 5, 4)
    alpha = torch.softmax(perspectives.aggregator(streams.mean(0)), dim=-1)
    expected = sum(alpha[..., i, None] * streams[i] for i in range(3))
    torch.testing.assert_close(perspectives.merge(hidden), expected)
    torch.testing.assert_close(perspectives.split(streams[0]), torch.cat([streams[0]] * 3))


@pytest.mark.parametrize("perspectives", [2, 4])
def test_decoding_state_is_p_times_larger(perspectives: int) -> None:
    def state_bytes(model: torch.nn.Module) -> int:
        _, state = model.prefill(torch.randint(0, 101, (2, 9)))
        tensors = [tensor for layer in state.layers for part in layer for tensor in
                   (part if isinstance(part, tuple) else (part,))]
        return sum(tensor.numel() * tensor.element_size() for tensor in tensors)

    assert state_bytes(tiny_model("rwkv4", perspectives=perspectives)) == perspectives * state_bytes(tiny_model("rwkv4"))


@pytest.mark.parametrize(("field", "value"), [("perspectives", 0), ("aggregator_init_std", -0.1)])
def test_bad_perspective_settings_are_refused(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"model.{field}="):
        tiny_model("rwkv4", **{field: value})


def test_perspectives_experiment_trains_only_the_mixes_and_the_aggregator(tmp_path: Path) -> None:
    base_dir = tmp_path / "base"
    train(compose_train(base_dir, "model=rwkv4", *FAST, "logger=none", "trainer.max_steps=2"))
    base = mcsd.load(base_dir).state_dict()
    overrides = ["experiment=rwkv_perspectives", "model.perspectives=3", f"init_from={base_dir}", *FAST,
                 "logger=none", "data.token_budget=null"]
    cfg = compose_train(tmp_path / "perspectives", *overrides)
    module = LanguageModelModule(model=cfg.model, optimizer=None, trainable=cfg.trainable)
    trained = {name for name, param in module.model.named_parameters() if param.requires_grad}
    mixes = {name for name in base if ".mix_" in name}
    assert len(mixes) == 5 * 2 and trained == mixes | {"streams.aggregator.weight", "streams.aggregator.bias"}

    train(compose_train(tmp_path / "perspectives", *overrides))
    tuned = mcsd.load(tmp_path / "perspectives").state_dict()
    changed = {name for name, value in base.items() if not torch.equal(value.expand_as(tuned[name]), tuned[name])}
    assert changed == mixes  # every shared weight is the base model's; every mix moved
    for name in mixes:  # from one row copied three times, each perspective moved on its own
        assert base[name].shape[0] == 1 and tuned[name].shape[0] == 3
        assert not torch.equal(tuned[name][0], tuned[name][1]) and not torch.equal(tuned[name][1], tuned[name][2])


def test_fine_tuning_refuses_weights_that_do_not_fit(tmp_path: Path) -> None:
    base_dir = tmp_path / "base"
    train(compose_train(base_dir, "model=rwkv4", *FAST, "logger=none", "trainer.max_steps=1",
                        "scheduler.warmup_steps=1"))
    with pytest.raises(MCSDError, match=r"init_from=.*do not fit this model .*size mismatch"):
        train(compose_train(tmp_path / "wide", "model=rwkv4", *FAST, "logger=none", "size=small",
                            f"init_from={base_dir}"))
    with pytest.raises(ConfigError, match=r"trainable=\['nothing'\] matches no parameter name"):
        train(compose_train(tmp_path / "none", "model=rwkv4", *FAST, "logger=none", "trainable=[nothing]",
                            f"init_from={base_dir}"))
    with pytest.raises(MCSDError, match=r"trainable=\['.*'\] trains part of a model that starts from scratch"):
        train(compose_train(tmp_path / "scratch", "model=rwkv4", *FAST, "logger=none", "trainable=['.*mix_.*']"))


@pytest.mark.inductor  # inductor's partitioner is the subject
def test_compiled_documents_apart_recompute_the_intra_chunk_weights() -> None:
    """Compiled with documents apart, no layer keeps its intra-chunk weights ``[chunks, C, C, D]``
    for the backward (they are recomputed there, under a checkpoint only compiled): the masks come
    from the position_ids that every layer shares, and inductor's partitioner otherwise saves
    whatever a later layer derives from them (19% more peak memory at size=base and 16,384
    tokens, experiments/train_throughput). The loss and gradients stay the eager ones."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = tiny_model("rwkv4", num_layers=2, chunk_size=4).train()
    ids = torch.randint(0, 101, (1, 65))
    position_ids = torch.cat([torch.arange(length) for length in (20, 30, 14)])[None]
    intra_chunk_shape = (16, 4, 4, model.config.hidden_size)  # 64 tokens in chunks of 4
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda tensor: saved.append(tuple(tensor.shape)) or tensor,
                                                  lambda tensor: tensor):
        loss, _ = model.loss_function(compile=True)(ids[:, :-1], ids[:, 1:], position_ids=position_ids)
    loss.backward()
    compiled_grads = [parameter.grad.clone() for parameter in model.parameters()]
    model.zero_grad()
    eager_loss, _ = model.loss(ids[:, :-1], ids[:, 1:], position_ids=position_ids)
    eager_loss.backward()
    assert saved and intra_chunk_shape not in saved
    assert loss.item() == pytest.approx(eager_loss.item(), rel=1e-6)
    assert all(torch.allclose(grad, parameter.grad, rtol=1e-4, atol=1e-8)
               for grad, parameter in zip(compiled_grads, model.parameters()))
