"""Checkpoints: safetensors weights plus the resolved config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import mcsd
from test_model_forms import MODELS, tiny_model


@pytest.mark.parametrize("name", ["mcsd-double_slope", "transformer"])
def test_save_load_round_trip(tmp_path: Path, name: str) -> None:
    model = tiny_model(name)
    mcsd.save(model, tmp_path / "model")
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert saved["_target_"] == MODELS[name][0]
    loaded = mcsd.load(tmp_path / "model")
    assert loaded.config == model.config and not loaded.training
    input_ids = torch.randint(0, 101, (2, 20))
    with torch.no_grad():
        assert torch.equal(loaded(input_ids), model(input_ids))


def test_tied_embeddings_stay_tied(tmp_path: Path) -> None:
    config = mcsd.MCSDConfig(vocab_size=50, hidden_size=8, num_channels=2, num_layers=1,
                             mlp_hidden_size=8, tie_embeddings=True)
    mcsd.save(mcsd.build_model(config), tmp_path)
    loaded = mcsd.load(tmp_path)
    assert loaded.lm_head.weight is loaded.embed.weight


def test_loading_a_folder_without_a_model_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json does not exist: point to a folder written by mcsd.save or an mcsd-train run"):
        mcsd.load(tmp_path)
