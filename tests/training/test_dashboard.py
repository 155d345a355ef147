"""What a training run's W&B record says about it (issue 91), read back from the real offline
``.wandb`` files through W&B's record schema: its group (the sweep, or the run alone), name, tags,
the config keys of where it comes from, a summary that says how it ended and the exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from helpers.runs import FAST, read_metrics, run_here, series
from mcsd.checkpoint.probe_results import DELTA_FILE
from mcsd.checkpoint.wandb_run import WandbFileError, find_wandb_runs, read_wandb_run, records
from mcsd.runtime import git_commit
from mcsd.errors import MCSDError
from mcsd.training.callbacks import Throughput, dense_peak_flops
from mcsd.training import memory
from mcsd.training.dashboard import exit_code_of


def only_run(folder: Path):
    (path,) = find_wandb_runs(folder)
    return read_wandb_run(path)


ALONE = [*FAST, "data=embedded", "seed=3", "callbacks.throughput.window_size=2",  # its rates from step 2 on
         "trainer.gradient_clip_val=1e-4"]  # the logged gradient norms are then far above what is clipped to


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A run alone, logged to W&B offline: its run folder and what it printed."""
    cwd = tmp_path_factory.mktemp("alone")
    result = run_here("mcsd-train", *ALONE, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (cwd / "logs" / "train" / "runs").iterdir()
    return run_dir, result.stdout


@pytest.fixture(scope="module")
def unlogged_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with ``logger.wandb.log_model=false``: its run folder."""
    cwd = tmp_path_factory.mktemp("unlogged")
    result = run_here("mcsd-train", *FAST, "data=embedded", "logger.wandb.log_model=false", "test_after_training=false",
                      cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (cwd / "logs" / "train" / "runs").iterdir()
    return run_dir


def test_a_run_alone_says_what_it_is_and_how_it_ended(alone: tuple[Path, str]) -> None:
    run_dir, stdout = alone
    run = only_run(run_dir)
    assert (run.group, run.name, run.exit_code) == (f"default/{run_dir.name}", "mcsd-full-tiny-seed3", 0)
    assert run.tags == ["default", "mcsd", "full", "tiny", "embedded"] and run.job_type == "train"
    assert run.config["experiment"] == "default" and run.config["sweep"] is None
    assert run.config["job/overrides"] == ALONE
    assert run.config["git_commit"] == git_commit() != ""
    rows = read_metrics(run_dir)
    validation, tokens = series(rows, "val/ppl"), series(rows, "trainer/tokens")
    best_step = min(validation, key=validation.get)
    assert run.summary["val/ppl_best"] == pytest.approx(validation[best_step])
    assert run.summary["val/tokens_at_best"] == tokens[best_step]
    assert run.summary["status"] == "finished"
    assert run.summary["test/ppl"] == pytest.approx(json.loads((run_dir / "result.json").read_text())["test_ppl"])
    assert f"(offline; upload with `wandb sync {run.path.parent}`)" in stdout
    # Every row at its own token count: the learning rate of step s (logged as it starts) after s
    # steps' tokens, the loss and the throughput of step s (logged as it ends) after s + 1.
    per_step = run.config["trainer/tokens_per_step"]
    rates = [row for row in run.history if "lr-AdamW/pg1" in row]
    throughput = [row for row in run.history if "train/device/items_per_sec" in row]
    losses = [row for row in run.history if "train/loss" in row]
    assert len(rates) == len(losses) == 6 and throughput
    assert all(row["trainer/tokens"] == row["trainer/global_step"] * per_step for row in rates)
    assert all(row["trainer/tokens"] == (row["trainer/global_step"] + 1) * per_step for row in throughput + losses)
    logged = {key for row in run.history for key in row}
    assert not [key for key in logged if key.startswith("validate/") or key.endswith(("/samples", "/batches"))]
    assert "lr-AdamW/pg2" not in logged and "train/device/flops_per_sec" in logged
    (artifact,) = run.artifacts  # the final model folder, file for file
    assert (artifact.name, artifact.type, "final" in artifact.aliases) == (f"model-{run.id}", "model", True)
    assert artifact.files == sorted(str(path.relative_to(run_dir / "model")) for path in (run_dir / "model").rglob("*")
                                    if path.is_file())
    assert (artifact.metadata["model/arch"], artifact.metadata["git_commit"]) == ("mcsd", git_commit())


def test_a_sweeps_jobs_share_its_group_and_have_names_of_their_own(tmp_path: Path) -> None:
    result = run_here("mcsd-train", "-m", *FAST, "data=embedded", "seed=0,1", "experiment_name=probe_sweep",
                      "test_after_training=false", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "logs" / "train" / "multiruns").iterdir()
    runs = sorted((read_wandb_run(path) for path in find_wandb_runs(sweep)), key=lambda run: run.name)
    assert [run.group for run in runs] == [f"probe_sweep/{sweep.name}"] * 2
    assert [run.name for run in runs] == ["mcsd-full-tiny-seed0-job0", "mcsd-full-tiny-seed1-job1"]
    assert [run.config["sweep"] for run in runs] == [sweep.name] * 2
    assert [[override for override in run.config["job/overrides"] if override.startswith("seed=")]
            for run in runs] == [["seed=0"], ["seed=1"]]  # each job's own, not the sweep's seed=0,1
    assert all("probe_sweep" in run.tags and run.exit_code == 0 for run in runs)
    assert f"W&B: 2 offline run folders: upload them with `wandb sync {sweep}/*/wandb/offline-run-*`" in result.stdout


def test_a_diverged_run_ends_with_exit_code_2_and_says_where(tmp_path: Path) -> None:
    result = run_here("mcsd-train", *FAST, "data=embedded", "optimizer.lr=1e6",
                      "callbacks.model_checkpoint.every_n_train_steps=1", cwd=tmp_path)
    assert result.returncode == 2
    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    run = only_run(run_dir)
    expected = json.loads((run_dir / "result.json").read_text())["diverged_at_step"]
    assert (run.exit_code, run.summary["status"], run.summary["diverged_at_step"]) == (2, "diverged", expected)


WRITE_A_LONG_RECORD = """
import sys, wandb
long = "".join(chr(ord("a") + index % 26) for index in range(100_000))
run = wandb.init(project="blocks", dir=sys.argv[1], config={"long": long}, name="blocks")
run.log({"x": 1.5})
run.finish(exit_code=7)
"""


def test_a_record_longer_than_a_block_reads_back_whole(tmp_path: Path) -> None:
    """A config value of 100 KB spans four 32 KiB blocks of the file (FIRST, MIDDLE, LAST chunks).
    Written by a Python of its own, as every W&B run of the harness is: not by this test worker's,
    which earlier in-process commands have used."""
    written = subprocess.run([sys.executable, "-c", WRITE_A_LONG_RECORD, str(tmp_path)], capture_output=True,
                             text=True, env={**os.environ, "WANDB_MODE": "offline"}, timeout=300)
    assert written.returncode == 0, written.stderr[-3000:]
    read = only_run(tmp_path)
    long = "".join(chr(ord("a") + index % 26) for index in range(100_000))
    assert read.config["long"] == long and read.name == "blocks" and read.exit_code == 7
    assert [row["x"] for row in read.history] == [1.5]


def test_a_file_that_is_not_a_wandb_run_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "run-x.wandb"
    path.write_bytes(b"not a run")
    with pytest.raises(WandbFileError, match=r"is not a W&B run file \(no ':W&B' header\)"):
        records(path)


def test_the_gradient_norm_is_logged_before_clipping_and_peak_memory_beside_it(alone: tuple[Path, str]) -> None:
    """With gradients clipped to a norm of 1e-4, the logged norms are the unclipped ones (orders of
    magnitude above it), at every logged step; the process's peak memory never falls."""
    rows = read_metrics(alone[0])
    norms, peaks = series(rows, "train/grad_norm"), series(rows, "train/peak_memory_bytes")
    assert sorted(norms) == sorted(series(rows, "train/loss")) and len(norms) == 6
    assert min(norms.values()) > 1e-2
    in_step_order = [peaks[step] for step in sorted(peaks)]  # the CSV's rows are not in step order
    assert in_step_order == sorted(in_step_order) and min(in_step_order) > 2**20


def test_the_peak_resident_memory_never_falls_though_the_kernels_mark_can(monkeypatch: pytest.MonkeyPatch) -> None:
    """``VmHWM`` sums lazily synced per-thread counters: a later reading a few pages lower is still
    reported as the peak seen before it."""
    readings = iter([5 * 2**20, 7 * 2**20, 7 * 2**20 - 53248, 9 * 2**20])
    monkeypatch.setattr(memory, "_high_water_mark_bytes", lambda: next(readings))
    monkeypatch.setattr(memory, "_highest_seen", 0)
    assert [memory.peak_resident_bytes() for _ in range(4)] == [5 * 2**20, 7 * 2**20, 7 * 2**20, 9 * 2**20]


def test_log_model_false_logs_no_artifact_and_a_value_it_cannot_take_is_refused(unlogged_model: Path,
                                                                                 tmp_path: Path) -> None:
    assert only_run(unlogged_model).artifacts == []
    (tmp_path / "refused").mkdir()
    refused = run_here("mcsd-train", *FAST, "data=embedded", "logger.wandb.log_model=all", cwd=tmp_path / "refused")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("mcsd-train: error:")]
    assert refused.returncode == 2 and errors == [
        "mcsd-train: error: logger.wandb.log_model='all' must be true (the final model folder as a W&B artifact of "
        "type model, offline too) or false (none); every checkpoint as an artifact is not offered"]
    assert not (tmp_path / "refused" / "logs" / "train").exists()  # no run folder (the corpus's cache stays)


@pytest.mark.slow
def test_a_measurement_names_the_training_run_whose_model_it_measured(unlogged_model: Path, tmp_path: Path) -> None:
    """The model folder records its training's W&B run; ``mcsd-eval`` and ``mcsd-probe context`` on it
    log runs of their own (group ``<command>/<run folder>``) whose config names that training run."""
    run_dir = unlogged_model
    trained = only_run(run_dir / "wandb")
    assert json.loads((run_dir / "model" / "training.json").read_text())["wandb_run"] == trained.id
    evaluated = run_here("mcsd-eval", f"ckpt={run_dir}", "tasks=local", "limit=4", "wandb.enabled=true",
                         cwd=tmp_path, env={"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    probed = run_here("mcsd-probe", "context", f"ckpt={run_dir}", "data=embedded", "length=64", "windows=[8,32]",
                      "num_documents=4", "num_positions=4", "batch_size=2", "bootstrap=20", "wandb.enabled=true",
                      cwd=tmp_path)
    assert probed.returncode == 0, probed.stderr[-3000:]
    for command in ("eval", "probe_context"):
        (folder,) = (tmp_path / "logs" / command / "runs").iterdir()
        measurement = only_run(folder)
        assert (measurement.group, measurement.job_type, measurement.exit_code) == (f"{command}/{folder.name}",
                                                                                   command, 0)
        assert measurement.config["trained_runs"] == [trained.id]
    written = pd.read_csv(folder / DELTA_FILE)  # the probe's Delta_N per window, as its CSV has them
    assert [measurement.summary[f"probe/delta_{window}"] for window in written["window"]] == pytest.approx(
        list(written["delta"]))


@pytest.mark.parametrize(("device", "name", "precision", "expected"), [
    ("cuda", "NVIDIA H200", "bf16-mixed", 989.4e12),  # a GPU Lightning's own table lacks
    ("cuda", "NVIDIA H100 PCIe", "bf16-true", 756e12),
    ("cuda", "NVIDIA H100 80GB HBM3", "32-true", 67e12),
    ("cuda", "Some Future GPU", "bf16-mixed", None),
    ("cpu", "", "32-true", None),
])
def test_mfu_divides_by_the_benchmarks_dense_peak(device: str, name: str, precision: str, expected: float | None) -> None:
    assert dense_peak_flops(torch.device(device), name, precision) == expected


def test_the_throughput_monitor_hands_that_peak_to_lightnings_meters(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Its setup replaces the peak Lightning's setup gave its throughput meters (its table's, or none on
    a CPU) with :func:`dense_peak_flops`'s (here made to answer 1e12 for the CPU)."""
    import lightning as L

    from mcsd.training import callbacks

    monkeypatch.setattr(callbacks, "dense_peak_flops", lambda device, name, precision: 1e12)
    monitor = Throughput(batch_size_fn=lambda batch: 1)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=tmp_path,
                        callbacks=[monitor], max_steps=1, enable_progress_bar=False, enable_model_summary=False)
    trainer.state.stage = "train"
    monitor.setup(trainer, L.LightningModule(), "fit")
    assert monitor.available_flops == 1e12 and monitor._throughputs
    assert all(throughput.available_flops == 1e12 for throughput in monitor._throughputs.values())


@pytest.mark.parametrize(("error", "code"), [
    (MCSDError("refused"), 2), (FileNotFoundError("gone"), 2), (KeyboardInterrupt(), 130),
    (SystemExit(143), 143), (SystemExit(None), 0), (RuntimeError("a bug"), 1)])
def test_a_run_ends_in_wandb_with_the_status_its_process_ends_with(error: BaseException, code: int) -> None:
    """As :func:`mcsd.commands.app.run_or_exit` ends the process: refused 2, Ctrl-C 130, a crash 1."""
    assert exit_code_of(error) == code


def test_an_offline_run_stays_offline_where_wandb_was_set_up_online(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B reads ``WANDB_MODE`` once per process: after a setup online (a notebook's, an earlier
    job's in one process), an offline run still writes its offline run folder, with no API key."""
    import wandb

    from mcsd.training.loggers import WandbLogger

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    wandb.teardown()
    wandb.setup()  # online: the mode W&B takes when nothing says otherwise
    try:
        run = WandbLogger(offline=True, save_dir=str(tmp_path), project="mcsd").experiment
        run.finish()
        assert len(find_wandb_runs(tmp_path)) == 1
    finally:
        wandb.teardown()  # later tests in this process set W&B up as they need
