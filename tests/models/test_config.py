"""Hydra composition of model/size/ablation, parameter counts and one-line config errors."""

from __future__ import annotations

import functools
import importlib.resources

import pytest
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

from mcsd import ConfigError, build_model, count_parameters
from mcsd.models import registry
from mcsd.models.mcsd import MCSDConfig
from mcsd.models.transformer import TransformerConfig

SIZES = ["tiny", "small", "base", "1.6b", "3b", "10b"]

ABLATIONS = {
    "full": ["slope", "decay"],
    "slope_only": ["slope"],
    "decay_only": ["decay"],
    "double_slope": ["slope", "slope"],
    "double_decay": ["decay", "decay"],
}


def compose_train(*overrides: str) -> DictConfig:
    with initialize_config_module("mcsd.conf", version_base=None):
        return compose("train", overrides=list(overrides))


@pytest.mark.parametrize("ablation", ABLATIONS)
def test_ablation_composes_into_the_model_node(ablation: str) -> None:
    cfg = compose_train("model=mcsd", "size=tiny", f"ablation={ablation}")
    assert list(cfg.model.sections) == ABLATIONS[ablation]
    model = build_model(cfg.model)
    assert [section.kind for section in model.layers[0].mixer.sections] == ABLATIONS[ablation]
    assert model.layers[0].mixer.out_proj.in_features == cfg.model.hidden_size * len(ABLATIONS[ablation])


def test_defaults_are_the_full_mcsd_block_and_the_small_size() -> None:
    cfg = compose_train()
    config = build_model(cfg.model).config
    assert isinstance(config, MCSDConfig)
    assert config.sections == ["slope", "decay"] and config.fusion == "concat"
    assert (config.hidden_size, config.num_channels, config.num_layers) == (128, 4, 4)


def test_sum_fusion_projects_from_hidden_size() -> None:
    model = build_model(compose_train("model.fusion=sum").model)
    assert model.layers[0].mixer.out_proj.in_features == model.config.hidden_size


@pytest.mark.parametrize("size", ["tiny", "small", "base"])
def test_transformer_composes_with_every_cpu_size(size: str) -> None:
    model = build_model(compose_train("model=transformer", f"size={size}").model)
    assert isinstance(model.config, TransformerConfig)
    assert model.layers[0].mixer.num_heads == model.config.num_channels


@pytest.mark.parametrize(("size", "target"), [("1.6b", 1.6e9), ("3b", 3e9), ("10b", 1e10)])
def test_paper_sizes_count_within_ten_percent(size: str, target: float) -> None:
    count = count_parameters(compose_train("model=mcsd", f"size={size}").model)
    assert abs(count - target) / target < 0.10, count


def test_count_parameters_equals_a_built_model() -> None:
    for overrides in [(), ("model.tie_embeddings=true",), ("model=transformer",), ("ablation=double_decay",)]:
        cfg = compose_train(*overrides)
        built = sum(p.numel() for p in build_model(cfg.model).parameters())
        assert count_parameters(cfg.model) == built


def test_plain_dict_configs_work() -> None:
    node = {"_target_": "mcsd.models.mcsd.MCSDConfig", "vocab_size": 10, "hidden_size": 8,
            "num_channels": 2, "num_layers": 1, "mlp_hidden_size": 8}
    assert build_model(node).config.channel_width == 4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("model.hidden_size=100", "model.num_channels=3"),
         "model.hidden_size=100 is not divisible by model.num_channels=3: choose a hidden_size"),
        (("model.sections=[slope,retention]",), "model.sections has unknown section 'retention': use slope or decay"),
        (("model.sections=[]",), "model.sections is empty"),
        (("model=transformer", "ablation=double_decay"),
         "model.sections is a setting of mcsd, not of transformer: drop the override (an ablation=... is MCSD's) "
         "or use model=mcsd"),
        (("model.fusion=product",), "model.fusion='product' is unknown: use concat or sum"),
        (("model.num_layers=0",), "model.num_layers=0 must be a positive integer"),
        (("+model.heads=4",), "model.heads is not a mcsd setting: remove it"),
        (("model._target_=torch.nn.Linear",), "model._target_='torch.nn.Linear' is not a model config: use one of "
                                              "mcsd.models.mcsd.configuration_mcsd.MCSDConfig"),
        (("model=transformer", "model.equal_params_to=rwkv9"), "architecture 'rwkv9' is not registered"),
    ],
)
def test_bad_configs_fail_at_build_time_with_one_line(overrides: tuple[str, ...], message: str) -> None:
    cfg = compose_train(*overrides)
    with pytest.raises(ConfigError) as error:
        build_model(cfg.model)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_missing_size_field_is_named() -> None:
    with pytest.raises(ConfigError, match="model.vocab_size is missing"):
        build_model({"_target_": "mcsd.models.mcsd.MCSDConfig", "hidden_size": 8})


@functools.cache
def counted(name: str, size: str) -> int:
    """The parameters of ``model=name size=size`` (each counted once for the tests that read it)."""
    return count_parameters(compose_train(f"model={name}", f"size={size}").model)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", registry.architectures())
def test_every_architecture_matches_mcsd_within_three_percent(name: str, size: str) -> None:
    """Equal size: each architecture's MLP width is chosen so its parameter count is MCSD's."""
    reference, count = counted("mcsd", size), counted(name, size)
    assert abs(count - reference) / reference <= 0.03, (count, reference)


def test_equal_size_width_is_the_closest_multiple_of_eight() -> None:
    """The Transformer at size=small: MLP width 344 (MCSD's 384 less the attention's extra
    2 D^2 - 4 D Dc = 16,384 weights per layer over 3 D per unit of width, rounded to 8)."""
    node = compose_train("model=transformer", "size=small").model
    assert node.mlp_hidden_size == 384 and node.equal_params_to == "mcsd"
    config = build_model(node).config
    assert config.mlp_hidden_size == 344 and config.equal_params_to is None  # the resolved config is literal
    reference = count_parameters(compose_train("model=mcsd", "size=small").model)
    counts = {width: count_parameters(TransformerConfig(**{**vars(config), "mlp_hidden_size": width}))
              for width in (336, 344, 352)}
    assert min(counts, key=lambda width: abs(counts[width] - reference)) == 344
    literal = build_model(compose_train("model=transformer", "size=small", "model.equal_params_to=null").model)
    assert literal.config.mlp_hidden_size == 384


def group_options(group: str) -> list[str]:
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType

    with initialize_config_module("mcsd.conf", version_base=None):
        return GlobalHydra.instance().config_loader().get_group_options(group, results_filter=ObjectType.CONFIG)


def test_the_ablation_group_is_generated_from_mcsds_variants() -> None:
    """``ablation=`` (the paper's word) holds MCSD's registered variants, no file of its own."""
    assert not (importlib.resources.files("mcsd.conf") / "ablation").is_dir()
    assert sorted(group_options("ablation")) == sorted(registry.get("mcsd").variants)
    for ablation in registry.get("mcsd").variants:
        assert registry.get("mcsd").variant_of(compose_train(f"ablation={ablation}").model) == ablation
    assert set(ABLATIONS) < set(registry.get("mcsd").variants)


@pytest.mark.parametrize("name", registry.architectures())
def test_every_variant_of_every_architecture_is_a_variant_option(name: str) -> None:
    architecture = registry.get(name)
    assert set(architecture.variants) <= set(group_options("variant"))
    for variant in architecture.variants:
        node = compose_train(f"model={name}", "size=tiny", f"variant={variant}").model
        assert architecture.variant_of(node) == variant
        build_model(node)


def test_a_variant_of_another_architecture_is_refused() -> None:
    with pytest.raises(ConfigError, match="model.sections is a setting of mcsd, not of transformer"):
        build_model(compose_train("model=transformer", "size=tiny", "variant=slope_only").model)


def test_a_registered_architecture_gets_its_nodes_and_loses_them_when_removed() -> None:
    """The registry is data; the command layer's nodes follow it (model/<name>, its variants)."""
    import dataclasses

    mcsd = registry.get("mcsd")
    toy = dataclasses.replace(mcsd, name="toy_variants", variant_group=None,
                              variants={"default": {}, "toy_sum": {"fusion": "sum"}})
    with pytest.raises(ConfigError, match="variant 'full' is a variant of mcsd already"):
        registry.register(dataclasses.replace(toy, variants={"full": {"fusion": "sum"}}))
    registry.register(toy)
    try:
        assert "toy_variants" in group_options("model") and "toy_sum" in group_options("variant")
        assert compose_train("model=toy_variants", "variant=toy_sum").model.fusion == "sum"
    finally:
        registry.unregister("toy_variants")
        mcsd.model_class.architecture = mcsd  # the toy shared MCSD's model class
    assert "toy_variants" not in group_options("model") and "toy_sum" not in group_options("variant")
