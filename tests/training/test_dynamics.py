"""callbacks.training_dynamics: each part's gradient norm and output RMS, the numbers of the
model's own gradients and outputs, logged every ``every_n_steps`` steps of a real run."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.models import tiny_model
from helpers.runs import FAST, compose_train, read_metrics, series

from mcsd.training.run import train
from mcsd.models.config import ConfigError
from mcsd.plots.dynamics import load_dynamics, plot_training_dynamics
from mcsd.training.callbacks import TrainingDynamics


def test_the_logged_numbers_are_each_parts_gradient_norm_and_output_rms() -> None:
    torch.manual_seed(0)
    model = tiny_model("retnet").train()
    logged: dict[str, float] = {}
    module = SimpleNamespace(model=model)
    logger = SimpleNamespace(log_metrics=lambda metrics, step: logged.update(metrics, step=step))
    trainer = SimpleNamespace(global_step=4, loggers=[logger])
    callback = TrainingDynamics(every_n_steps=2)
    callback.on_fit_start(trainer, module)
    logits = model(torch.randint(0, 101, (2, 12)))
    logits.square().mean().backward()
    callback.on_before_optimizer_step(trainer, module, None)
    callback.on_fit_end(trainer, module)
    parts = ["embed", "layers.0.mixer", "layers.0.mlp", "layers.1.mixer", "layers.1.mlp", "lm_head"]
    assert logged.pop("step") == 4
    assert sorted(logged) == sorted([f"dynamics/grad_norm/{part}" for part in parts]
                                    + [f"dynamics/output_rms/{part}" for part in parts])
    for part in parts:
        gradients = torch.cat([parameter.grad.flatten() for parameter in model.get_submodule(part).parameters()])
        assert logged[f"dynamics/grad_norm/{part}"] == pytest.approx(gradients.norm().item(), rel=1e-5)
    assert logged["dynamics/output_rms/lm_head"] == pytest.approx(logits.detach().pow(2).mean().sqrt().item(), rel=1e-6)
    assert not model.layers[0].mixer._forward_hooks  # removed at the end of fit
    logged.clear()
    callback.on_before_optimizer_step(SimpleNamespace(global_step=5, loggers=[logger]), module, None)  # not a step to log
    assert logged == {}


def test_a_run_logs_them_every_n_steps_and_none_when_off(tmp_path: Path) -> None:
    train(compose_train(tmp_path / "on", *FAST, "logger=csv", "test_after_training=false",
                        "callbacks.training_dynamics.every_n_steps=3"))
    rows = read_metrics(tmp_path / "on")
    norms = series(rows, "dynamics/grad_norm/layers.0.mixer")
    assert sorted(norms) == [0, 3] and all(value > 0 for value in norms.values())
    assert sorted(series(rows, "dynamics/output_rms/layers.1.mlp")) == [0, 3]
    train(compose_train(tmp_path / "off", *FAST, "logger=csv", "test_after_training=false"))
    assert not any(key.startswith("dynamics/") for key in read_metrics(tmp_path / "off")[0])
    # The figure reads the run that logged them and leaves the other out.
    dynamics = load_dynamics(tmp_path)
    assert set(dynamics["run"]) == {"on/csv/version_0"} and set(dynamics["label"]) == {"MCSD full, lr 0.0008"}  # the default lr
    assert dynamics.dropna(subset=["dynamics/grad_norm/layers.0.mixer"])["step"].tolist() == [0, 3]
    assert dynamics["dynamics/grad_norm/layers.0.mixer"].max() == pytest.approx(max(norms.values()))
    paths = plot_training_dynamics(dynamics, tmp_path / "figure", "dynamics")
    assert [path.name for path in paths] == ["dynamics.png", "dynamics.pdf"] and all(path.stat().st_size for path in paths)


def test_a_bad_interval_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"callbacks.training_dynamics.every_n_steps=-1 must be an integer >= 0"):
        TrainingDynamics(every_n_steps=-1)
