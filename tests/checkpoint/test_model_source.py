"""A model entry resolved once (:mod:`mcsd.checkpoint.model_source`): a registered architecture
at a size, a run's config YAML and a saved model, each with its architecture, variant, what a
measuring process opens and a result row's size."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

import mcsd
from mcsd.checkpoint.model_source import REGISTERED, RUN_CONFIG, SAVED, resolve
from mcsd.errors import MCSDError
from mcsd.models.build import make_config


def composed(*overrides: str) -> dict:
    return OmegaConf.to_container(compose("build", overrides=list(overrides)).model, resolve=True)


def test_a_registered_name_is_the_node_mcsd_train_builds_with_its_variant_where_it_has_one() -> None:
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        ablated = resolve("mcsd", "tiny", "slope_only")
        plain = resolve("transformer", "tiny", "slope_only")  # a variant the Transformer lacks: its own
        expected = composed("model=mcsd", "size=tiny", "variant=slope_only"), composed("model=transformer", "size=tiny")
    assert (ablated.kind, ablated.architecture.name, ablated.variant) == (REGISTERED, "mcsd", "slope_only")
    assert (ablated.node, plain.node) == expected and plain.variant == "default"
    assert ablated.spec == make_config(expected[0])  # resolved here, once: a point builds it at once
    assert ablated.size_label("tiny") == "tiny" and ablated.saved is None


def test_a_run_config_and_a_saved_model_name_their_architecture_and_what_to_open(tmp_path: Path) -> None:
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        node = composed("model=mcsd", "size=tiny", "ablation=decay_only")
    logged = tmp_path / "hparams.yaml"
    logged.write_text(yaml.safe_dump({"seed": 0, "model": node}))
    from_config = resolve(str(logged), "small")
    assert (from_config.kind, from_config.architecture.name, from_config.variant) == (RUN_CONFIG, "mcsd", "decay_only")
    assert from_config.node == node and from_config.spec == make_config(node)
    assert from_config.size_label("small") == RUN_CONFIG

    model = mcsd.build_model(node)
    mcsd.save(model, tmp_path / "model")
    saved = resolve(str(tmp_path / "model"), "small")
    assert (saved.kind, saved.architecture.name, saved.variant) == (SAVED, "mcsd", "decay_only")
    assert saved.spec == str(tmp_path / "model") and saved.size_label("small") == SAVED
    assert dataclasses.asdict(saved.saved.config()) == dataclasses.asdict(model.config)


def test_a_yaml_without_a_model_node_is_refused_in_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("seed: 0\n")
    with pytest.raises(MCSDError, match="empty.yaml holds no model node"):
        resolve(str(empty), "tiny")
