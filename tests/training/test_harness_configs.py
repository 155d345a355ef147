"""The harness's config groups compose, and the learning-rate schedule is what it says."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module

from helpers.runs import compose_train, read_metrics, run_here, series
from mcsd.models import registry
from mcsd.training.run import train
from mcsd.training.schedule import auto_warmup_steps, warmup_cosine


def compose_with_hydra(*overrides: str):
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def test_warmup_then_cosine_to_the_floor() -> None:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    schedule = warmup_cosine(optimizer, total_steps=110, warmup_steps=10, min_lr_ratio=0.1)
    rates = []
    for _ in range(110):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[:3] == pytest.approx([0.1, 0.2, 0.3])
    assert rates[9] == pytest.approx(1.0) and rates[10] == pytest.approx(1.0)
    assert rates[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert rates[-1] == pytest.approx(0.1, abs=1e-3)


def test_auto_warmup_is_a_tenth_of_the_run_within_bounds() -> None:
    """``warmup_steps=auto`` (the default): 30 steps of the 300-step main job, as before; any run
    length works (1 step at least, 2000 at most)."""
    assert [auto_warmup_steps(steps) for steps in (1, 5, 20, 300, 19_999, 10**6)] == [1, 1, 2, 30, 1999, 2000]
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    warmup_cosine(optimizer, total_steps=20)  # auto: 2 steps
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5)
    assert compose_with_hydra().scheduler.warmup_steps == "auto"


@pytest.mark.parametrize(
    ("launcher", "target"),
    [("local_parallel", "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"),
     ("slurm", "hydra_plugins.mcsd_slurm_launcher.TrainerSlurmLauncher")],
)
def test_launchers_compose(launcher: str, target: str) -> None:
    cfg = compose_with_hydra(f"hydra/launcher={launcher}")
    assert cfg.hydra.launcher._target_ == target


def test_experiment_sweeps_both_models() -> None:
    cfg = compose_with_hydra("experiment=mcsd_vs_transformer")
    assert cfg.hydra.sweeper.params.model == "mcsd,transformer"
    assert cfg.experiment_name == "mcsd_vs_transformer" and cfg.model.hidden_size == 128


def test_decay_init_study_runs_fig9_settings_over_its_arms() -> None:
    """Its arms are the decay settings, slope_only and the Transformer, each on Fig. 9's data,
    budget and schedule; each arm's run is labelled by what it changes."""
    study, fig9 = compose_with_hydra("experiment=decay_init_study"), compose_with_hydra("experiment=fig9_ablation")
    assert study.experiment_name == "decay_init_study"
    for key in ("data", "scheduler", "trainer", "optimizer"):
        assert study[key] == fig9[key], key
    labels = []
    for arm in study.hydra.sweeper.arms:
        model = compose_with_hydra("experiment=decay_init_study", *arm.split()).model
        architecture = registry.of_target(model._target_)
        labels.append(f"{architecture.name}: {architecture.variant_of(model)}")
    assert labels == ["mcsd: full, decay_norm_gain_init=1.0", "mcsd: full, decay_norm_gain_init=0.1", "mcsd: full",
                      "mcsd: full, decay_norm=sum", "mcsd: slope_only", "transformer: default"]


@pytest.mark.parametrize("debug", ["default", "fdr", "overfit", "profiler"])
def test_debug_configs_compose(debug: str) -> None:
    cfg = compose_with_hydra(f"debug={debug}")
    assert cfg.task_name == "debug" and cfg.trainer.max_steps >= 4


@pytest.mark.parametrize("trainer", ["cpu", "gpu", "ddp", "fsdp"])
def test_trainer_configs_compose(trainer: str) -> None:
    cfg = compose_with_hydra(f"trainer={trainer}")
    assert cfg.trainer._target_ == "lightning.pytorch.trainer.Trainer"


def test_generate_names_a_missing_model(tmp_path: Path) -> None:
    result = run_here("mcsd-generate", f"ckpt={tmp_path / 'nothing'}", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("mcsd-generate: error:") and "nothing does not exist: point to a model folder" in result.stderr


@pytest.mark.slow
def test_debug_overfit_drives_the_training_loss_to_about_zero(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """What debug=overfit claims: on the same 2 batches the loss falls to ~0 (here the tiny model's
    in its 150 steps; the default size's is measured in conf/debug/overfit.yaml); its report says
    the validation number is meaningless by design."""
    cfg = compose_train(tmp_path / "run", "debug=overfit", "size=tiny", "logger=csv",
                        "callbacks.progress_bar.refresh_rate=0", "test_after_training=false")
    train(cfg)
    losses = series(read_metrics(tmp_path / "run"), "train/loss")
    assert losses[0] > 0.9 * math.log(cfg.model.vocab_size) and losses[149] < 0.1, (losses[0], losses[149])
    report = capsys.readouterr().out
    assert f"final training loss: {losses[149]:.4f} on the 2 batches this run overfits" in report
    assert "held-out text that an overfitting run does not learn: high by design" in report


PROGRESS_RUN = ["size=tiny", "data.seq_len=64", "data.batch_size=8", "trainer.max_steps=12",
                "+trainer.limit_train_batches=5", "trainer.val_check_interval=5", "trainer.limit_val_batches=1",
                "scheduler.warmup_steps=2", "logger=none", "test_after_training=false", "callbacks.model_checkpoint=null",
                "callbacks.final_model=null"]


def test_progress_lines_count_the_runs_steps_and_tokens_when_output_is_not_a_terminal(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Output to a file: no bar, a line every line_every_s seconds (0: every step) and after each
    validation, counting the run's steps across epochs (5 batches an epoch, 12 steps) and tokens."""
    train(compose_train(tmp_path / "run", *PROGRESS_RUN, "callbacks.progress_bar.line_every_s=0"))
    lines = [line for line in capsys.readouterr().out.splitlines() if ": step " in line]
    steps = [int(line.split(": step ")[1].split("/")[0]) for line in lines]
    assert steps == [1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10, 10, 11, 12]  # each step; each validation in training (5, 10)
    assert lines[0].startswith("Epoch 0: step 1/12 (8%), 512 tokens, ")
    assert lines[-1].startswith("Epoch 2: step 12/12 (100%), 6,144 tokens, ") and "left" not in lines[-1]
    assert "~0:00:" in lines[0] and "train/loss" in lines[0] and "val/loss" in lines[5] and "val/loss" not in lines[0]


def test_the_bar_counts_the_runs_steps_on_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal: one bar over the run's 12 steps that goes on across its 3 epochs (not a bar
    of each epoch's 5 batches), with the tokens seen."""
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    train(compose_train(tmp_path / "run", *PROGRESS_RUN, "callbacks.progress_bar.refresh_rate=1"))
    frames = [frame for frame in capsys.readouterr().out.replace("\r", "\n").splitlines() if frame.startswith("Epoch")]
    assert frames and not any(": step " in frame for frame in frames)
    assert any("Epoch 1: " in frame and "| 7/12 [" in frame for frame in frames)
    assert "| 12/12 [" in frames[-1] and "tokens=6,144" in frames[-1] and frames[-1].startswith("Epoch 2:")

