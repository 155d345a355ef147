"""Saved models: tied weights survive, a path that holds no model is named, and every file is
readable by others (round trips of every architecture: tests/models/test_conformance.py; checkpoints of
a run: tests/training/test_train.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.models import tiny_config

import mcsd
from mcsd.models.mcsd import MCSDConfig


def test_tied_embeddings_stay_tied(tmp_path: Path) -> None:
    config = MCSDConfig(vocab_size=50, hidden_size=8, num_channels=2, num_layers=1, mlp_hidden_size=8,
                        tie_embeddings=True)
    mcsd.save(mcsd.build_model(config), tmp_path)
    loaded = mcsd.load(tmp_path)
    assert loaded.lm_head.weight is loaded.embed.weight


def test_a_saved_model_runs_the_kernels_of_the_machine_that_loads_it(tmp_path: Path) -> None:
    """model.kernels is a choice of the run: a model trained with kernels=fla is saved as auto
    (fla on a GPU where it imports, PyTorch elsewhere), and a config of before the setting loads as auto."""
    model = mcsd.build_model(tiny_config("retnet", kernels="fla"))
    assert model.config.kernels == "fla" and model.context("chunk").kernels == "fla"
    mcsd.save(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["kernels"] == "auto"
    assert mcsd.load(tmp_path).context("chunk").kernels == "auto"
    legacy = {key: value for key, value in tiny_config("retnet").items() if key != "kernels"}
    assert mcsd.build_model(legacy).config.kernels == "auto"


def test_a_path_without_a_model_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="holds no config.json \\+ model.safetensors nor checkpoints/last.ckpt: "
                                                "point to a model folder"):
        mcsd.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="nothing does not exist"):
        mcsd.load(tmp_path / "nothing")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(FileNotFoundError, match="notes.txt is not a .ckpt file"):
        mcsd.load_tokenizer(tmp_path / "notes.txt")


def test_configs_saved_before_the_registry_still_load(tmp_path: Path) -> None:
    """config.json files written when the config classes lived in mcsd.models.config."""
    legacy = {"_target_": "mcsd.models.config.TransformerConfig", "vocab_size": 10, "hidden_size": 8,
              "num_channels": 2, "num_layers": 1, "mlp_hidden_size": 8}
    assert type(mcsd.build_model(legacy).config).__module__ == "mcsd.models.transformer.configuration_transformer"


def test_a_saved_model_is_readable_by_others(tmp_path: Path) -> None:
    """Every file of a model folder gets the mode a file made with ``open()`` gets (0644 under the
    usual umask): safetensors writes its weights 0600, which others cannot read."""
    previous = os.umask(0o022)
    try:
        folder = mcsd.save(mcsd.build_model(tiny_config("mcsd")), tmp_path / "model")
        assert {path.name: oct(path.stat().st_mode & 0o777) for path in folder.iterdir()} == {
            "config.json": "0o644", "model.safetensors": "0o644"}
    finally:
        os.umask(previous)


def test_a_file_this_user_may_not_read_is_not_called_corrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unreadable last.ckpt or model.safetensors was reported as truncated or corrupt: it is a
    PermissionError naming the file (the commands' one line of this user's rights). As root every file
    is readable, so the rights are taken away where the project asks for them."""
    import torch

    from mcsd.checkpoint.lightning_checkpoint import read_checkpoint
    from mcsd.checkpoint.saved_model import read_safetensors

    checkpoint, weights = tmp_path / "last.ckpt", tmp_path / "model.safetensors"
    torch.save({"global_step": 3}, checkpoint)
    from safetensors.torch import save_file

    save_file({"embed.weight": torch.zeros(2, 2)}, str(weights))
    assert read_checkpoint(checkpoint)["global_step"] == 3 and set(read_safetensors(weights)) == {"embed.weight"}
    monkeypatch.setattr("mcsd.files.os.access", lambda path, mode: False)
    for read, path in ((read_checkpoint, checkpoint), (read_safetensors, weights)):
        with pytest.raises(PermissionError) as error:
            read(path)
        assert error.value.filename == str(path) and error.value.strerror == "Permission denied"
