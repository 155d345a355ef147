"""Fault injection: a run killed (SIGKILL) or interrupted (Ctrl-C) mid-training resumes
exactly; a checkpoint write that fails (a full disk) leaves the previous checkpoint whole;
two runs building one cache at the same time both succeed with one cache."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from helpers.runs import FAST, command, compose_train, read_metrics, run_cli, run_here, series, train_refusal
from mcsd.data import LanguageModelDataModule
from mcsd.errors import MCSDError
from mcsd.checkpoint.lightning_checkpoint import read_checkpoint
from mcsd.training.run import train
from mcsd.training.sweep import summary
from mcsd.checkpoint.lightning_writer import mount_point
from mcsd.checkpoint.resume import latest_checkpoint
from mcsd.checkpoint.wandb_run import find_wandb_runs, read_wandb_run

STEPS = 16
SLOW = ["size=small", "data.seq_len=128", "data.batch_size=8", f"trainer.max_steps={STEPS}", "logger=csv",
        "callbacks.model_checkpoint.every_n_train_steps=2", "callbacks.progress_bar.refresh_rate=0",
        "trainer.val_check_interval=100", "trainer.limit_val_batches=2", "trainer.log_every_n_steps=1",
        "test_after_training=false",
        "scheduler.warmup_steps=15"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """The training losses of the run the interrupted ones must reproduce."""
    cwd = tmp_path_factory.mktemp("whole")
    result = run_here("mcsd-train", *SLOW, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (cwd / "logs" / "train" / "runs").iterdir()
    return series(read_metrics(run), "train/loss")


def start_then_signal(cwd: Path, signum: int, *extra: str, env: dict[str, str] | None = None
                      ) -> tuple[subprocess.Popen, str, Path]:
    """Start a run, send ``signum`` once its step-2 checkpoint exists; (process, stderr, run dir)."""
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", **(env or {})}
    process = subprocess.Popen([command("mcsd-train"), *SLOW, *extra], cwd=cwd, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(cwd.glob("logs/train/runs/*/checkpoints/step-000002.ckpt")):
        assert process.poll() is None and time.monotonic() < deadline, "training did not start"
        time.sleep(0.05)
    process.send_signal(signum)
    stderr = process.communicate(timeout=300)[1]
    (run,) = (cwd / "logs" / "train" / "runs").iterdir()
    return process, stderr, run


def resume_and_compare(cwd: Path, run: Path, expected: dict[int, float]) -> int:
    """Resume ``run`` (its latest checkpoint) to the end, with the command's entry point in this
    process (the stopped run was a process of its own); its losses equal ``expected`` from the
    checkpoint's step on. Returns that step."""
    step = read_checkpoint(latest_checkpoint(run))["global_step"]
    before = set((cwd / "logs" / "train" / "runs").iterdir())
    result = run_here("mcsd-train", f"resume={run}", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    (resumed,) = set((cwd / "logs" / "train" / "runs").iterdir()) - before
    losses = series(read_metrics(resumed), "train/loss")
    assert sorted(losses) == list(range(step, STEPS))
    assert losses == {key: value for key, value in expected.items() if key >= step}
    assert (resumed / "model" / "model.safetensors").is_file()
    return step


@pytest.mark.slow
def test_a_killed_run_resumes_exactly_from_its_last_checkpoint(uninterrupted: dict[int, float],
                                                                tmp_path: Path) -> None:
    process, _, run = start_then_signal(tmp_path, signal.SIGKILL)
    assert process.returncode == -signal.SIGKILL and not (run / "model").exists()
    for checkpoint in run.glob("checkpoints/*.ckpt"):  # whatever was being written when it died is not among them
        assert read_checkpoint(checkpoint)["global_step"] >= 2
    assert resume_and_compare(tmp_path, run, uninterrupted) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_with_a_checkpoint_and_says_how_to_resume(uninterrupted: dict[int, float], tmp_path: Path,
                                                                 signum: int) -> None:
    """SIGINT (Ctrl-C) or SIGTERM (kill, a preemption outside SLURM): the run stops at the end of
    that step with a checkpoint of it, exits 128 + the signal with one line naming the checkpoint
    and the command, writes no model folder; before the run's minimum length too (min_steps,
    min_epochs: Lightning alone would go on to it, checkpointing every step)."""
    process, stderr, run = start_then_signal(tmp_path, signum, f"+trainer.min_steps={STEPS}", "+trainer.min_epochs=2")
    assert process.returncode == 128 + signum, stderr[-2000:]
    hint = [line for line in stderr.splitlines() if line.startswith("mcsd-train: interrupted at step ")]
    assert len(hint) == 1 and f"resume with `mcsd-train resume={run}`" in hint[0] and "Traceback" not in stderr
    stopped_at = int(hint[0].split("step ")[1].split(":")[0])
    assert stopped_at < STEPS and "has not been met" not in stderr
    assert (run / "checkpoints" / f"step-{stopped_at:06d}.ckpt").is_file() and not (run / "model").exists()
    assert resume_and_compare(tmp_path, run, uninterrupted) == stopped_at


@pytest.mark.slow
def test_a_preempted_slurm_job_requeues_itself_and_goes_on_exactly(uninterrupted: dict[int, float],
                                                                   tmp_path: Path) -> None:
    """Under SLURM (SLURM_JOB_ID set; scontrol is a stand-in that records its call), SIGTERM stops
    the run with a checkpoint and requeues the job; the job, started again with the same command
    and run directory, goes on from that checkpoint in that directory, with the unbroken run's losses."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol.log"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho scontrol \"$@\" >> {calls}\n")
    (bin_dir / "scontrol").chmod(0o755)
    env = {"SLURM_JOB_ID": "4242", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    run = tmp_path / "logs" / "train" / "runs" / "job"
    process, stderr, _ = start_then_signal(tmp_path, signal.SIGTERM, f"hydra.run.dir={run}", env=env)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    hint = [line for line in stderr.splitlines() if line.startswith("mcsd-train: interrupted at step ")]
    assert len(hint) == 1 and "SLURM job 4242 requeued: it goes on from this checkpoint" in hint[0]
    assert calls.read_text() == "scontrol requeue 4242\n"
    stopped_at = int(hint[0].split("step ")[1].split(":")[0])
    again = run_cli("mcsd-train", *SLOW, f"hydra.run.dir={run}", cwd=tmp_path, env=env)  # the requeued job
    assert again.returncode == 0, again.stderr[-3000:]
    losses = series(read_metrics(run), "train/loss")  # both lives appended to the run's own log
    assert losses == uninterrupted and (run / "model" / "model.safetensors").is_file()
    assert stopped_at >= 2 and list((tmp_path / "logs" / "train" / "runs").iterdir()) == [run]


@pytest.mark.parametrize("failure", ["ENOSPC", "short write"])
def test_a_failed_checkpoint_write_leaves_the_previous_checkpoint_whole(tmp_path: Path, failure: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills while the step-6 checkpoint is written (an ``ENOSPC``, or torch's zip writer's
    ``unexpected pos`` on a disk with nothing left, as a real full disk ends): the run ends in one
    line naming the file system, the last whole checkpoint and how to resume; last.ckpt is still the
    step-3 one, whole, and no partial file is left."""
    save = torch.save
    written = []

    def save_until_the_disk_is_full(obj, handle, *args, **kwargs):
        if isinstance(obj, dict) and "state_dict" in obj:
            written.append(obj["global_step"])
            if obj["global_step"] == 6:
                handle.write(b"the first bytes of a checkpoint")
                if failure == "ENOSPC":
                    raise OSError(errno.ENOSPC, "No space left on device")
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 17983040 vs 17982932")
        return save(obj, handle, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_until_the_disk_is_full)
    monkeypatch.setattr("mcsd.checkpoint.lightning_writer.shutil.disk_usage", lambda path: shutil._ntuple_diskusage(1, 1, 0))
    checkpoints = tmp_path / "run" / "checkpoints"
    expected = (f"no space left on {mount_point(tmp_path)} (writing {checkpoints}/step-000006.ckpt, 0 MiB written): "
                f"the checkpoint was not saved; {checkpoints}/last.ckpt is the last whole checkpoint; free some space "
                f"and resume with `mcsd-train resume={tmp_path}/run`")
    with pytest.raises(MCSDError, match=f"^{re.escape(expected)}$"):
        train(compose_train(tmp_path / "run", *FAST, "logger=csv"))
    assert 6 in written
    monkeypatch.setattr(torch, "save", save)
    assert read_checkpoint(checkpoints / "last.ckpt")["global_step"] == 3
    assert sorted(path.name for path in checkpoints.iterdir()) == ["last.ckpt", "step-000003.ckpt"]


def build_cache(corpus: str, cache_dir: str, start: multiprocessing.synchronize.Event, out: str) -> None:
    """Build the data module's cache; write its tokenizer to ``out`` and, to ``out.trained``,
    how many tokenizers this process trained."""
    import mcsd.data.datamodule as datamodule

    trained = []
    train_tokenizer = datamodule.train_tokenizer
    datamodule.train_tokenizer = lambda *args: trained.append(1) or train_tokenizer(*args)
    start.wait()
    data = LanguageModelDataModule(source="text_files", paths=[corpus], sample_by="line", vocab_size=2048,
                                   seq_len=64, cache_dir=cache_dir)
    data.build()
    Path(out).write_text(data.tokenizer.to_str())
    Path(f"{out}.trained").write_text(str(len(trained)))


@pytest.mark.slow
def test_two_runs_build_one_shared_cache_at_once(tmp_path: Path) -> None:
    """Started together on one cache folder, both succeed; one trains the tokenizer and writes
    the token shards, the other waits and reuses them."""
    rng = random.Random(0)
    words = [f"w{index}{'x' * (index % 7)}" for index in range(3000)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choices(words, k=20)) for _ in range(20000)))
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    outputs = [tmp_path / f"tokenizer-{index}.json" for index in range(2)]
    processes = [context.Process(target=build_cache, args=(str(corpus), str(tmp_path / "cache"), start, str(out)))
                 for out in outputs]
    for process in processes:
        process.start()
    time.sleep(1.0)  # both are waiting: start them at once
    start.set()
    for process in processes:
        process.join(timeout=600)
        assert process.exitcode == 0
    assert outputs[0].read_text() == outputs[1].read_text()
    assert sum(int(Path(f"{out}.trained").read_text()) for out in outputs) == 1  # built once, then found
    (cache,) = [path for path in (tmp_path / "cache").iterdir() if path.name.startswith("files-")]
    assert len(list(cache.glob("tokenizer-*.json"))) == 1 and len(list(cache.glob("tokens-*/train/index.json"))) == 1


@pytest.mark.parametrize(("settings", "message"), [
    (["optimizer.lr=1e6", "callbacks.model_checkpoint.every_n_train_steps=1"], "the weights are not finite at step 2: training diverged; lower optimizer.lr (now 1e+06); "
                           "the last checkpoint with finite weights is "),
    (["optimizer.lr=1e2", "trainer.gradient_clip_val=null", "callbacks.model_checkpoint.every_n_train_steps=2"], "the training loss is nan at step 9: training diverged; "
     "lower optimizer.lr (now 100), or clip gradients (trainer.gradient_clip_val=1.0); the last checkpoint with finite "
     "weights is "),
])
def test_a_diverged_run_stops_at_once_and_keeps_only_finite_checkpoints(tmp_path: Path, settings: list[str],
                                                                         message: str) -> None:
    """A learning rate that sends the run to NaN (it went on for every step, saved a NaN checkpoint
    and model and exited 0 with a bare NaN in result.json): one line naming the step, the loss
    and the fix, exit status 2, every checkpoint left on disk finite (the one named is the newest),
    no model folder, and result.json valid JSON that says where it diverged."""
    run = tmp_path / "run"
    line = train_refusal(run, *[setting for setting in FAST if "every_n_train_steps" not in setting],
                         "trainer.max_steps=30", "trainer.val_check_interval=100", "logger=csv", *settings)
    assert message in line, line
    result = json.loads((run / "result.json").read_text())
    assert result["diverged_at_step"] == int(re.search(r"at step (\d+)", line).group(1)) and result["val_ppl"] is None
    assert not (run / "model").exists()
    saved = sorted((run / "checkpoints").glob("step-*.ckpt"))
    for checkpoint in saved:
        weights = read_checkpoint(checkpoint)["state_dict"]
        assert all(torch.isfinite(value).all() for value in weights.values() if value.is_floating_point()), checkpoint
    assert saved and line.endswith(f"the last checkpoint with finite weights is {saved[-1]}")
    assert int(saved[-1].stem.split("-")[1]) <= result["diverged_at_step"]


def _write_jobs(sweep: Path, jobs: list[tuple[list[str], dict | None, dict]]) -> None:
    """Job folders as a sweep leaves them: each one's overrides, result.json and chosen config groups."""
    for job, (overrides, result, choices) in enumerate(jobs):
        folder = sweep / str(job) / ".hydra"
        folder.mkdir(parents=True)
        (folder / "overrides.yaml").write_text("\n".join(f"- {item}" for item in overrides) + "\n")
        (folder / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"runtime": {"choices": choices}}}))
        if result is not None:
            (sweep / str(job) / "result.json").write_text(json.dumps(result))


def test_a_sweeps_summary_says_how_each_job_ended(tmp_path: Path) -> None:
    """The sweep's closing lines read each job's result.json: a diverged job says at which step, a
    refused one why, one that never wrote its result that it did not finish."""
    corpus = {"data": "embedded"}
    _write_jobs(tmp_path, [(["optimizer.lr=1e-3"], {"val_ppl": 12.5, "test_ppl": 13.25}, corpus),
                           (["optimizer.lr=1e6"], {"diverged_at_step": 2, "val_ppl": None}, corpus),
                           (["optimizer.lr=1e-2"], None, corpus),
                           (["optimizer.lr=-1"], {"status": "refused", "reason": "optimizer.lr=-1 must be 0 or more"},
                            corpus)])
    assert summary(tmp_path, "train").splitlines()[1:] == [
        "  job 0: optimizer.lr=1e-3: val ppl 12.50, test ppl 13.25",
        "  job 1: optimizer.lr=1e6: diverged at step 2 (no result)",
        "  job 2: optimizer.lr=1e-2: no result (it did not finish)",
        "  job 3: optimizer.lr=-1: refused: optimizer.lr=-1 must be 0 or more",
        f"plot: mcsd-plot ablation source={tmp_path} (or mcsd-plot scaling source={tmp_path} for a sweep of sizes)"]


@pytest.mark.parametrize(("choices", "plot"), [
    ([{"data": "mad", "task": "in_context_recall"}, {"data": "mad", "task": "selective_copying"}], "tasks"),
    ([{"data": "mqar", "task": None}, {"data": "mqar", "task": None}], "mqar"),
    ([{"data": "embedded", "task": None}, {"data": "embedded", "task": None}], "ablation"),
])
def test_a_sweeps_summary_suggests_the_plot_that_fits_it(tmp_path: Path, choices: list[dict], plot: str) -> None:
    """A sweep of MAD's tasks is drawn task by task, an MQAR sweep by width, one corpus's as an ablation
    (mcsd-plot ablation would average six tasks as six seeds)."""
    _write_jobs(tmp_path, [([f"model={model}"], {"val_ppl": 2.0}, chosen)
                           for model, chosen in zip(["mcsd", "transformer"], choices)])
    assert summary(tmp_path, "train").splitlines()[-1].startswith(f"plot: mcsd-plot {plot} source={tmp_path}")


def test_a_sweep_of_another_command_ends_with_status_0_when_its_jobs_finished(tmp_path: Path) -> None:
    """An mcsd-bench sweep's jobs write no result of their own: each records that it finished, and
    the sweep's summary says so (it said "no result (it did not finish)", and would exit 1)."""
    from mcsd.training.sweep import end_sweep

    _write_jobs(tmp_path, [([f"models=[{model}]"], {"status": "finished"}, {}) for model in ("mcsd", "retnet")])
    assert end_sweep(tmp_path, "bench", None) == 0
    assert summary(tmp_path, "bench").splitlines()[1:] == ["  job 0: models=[mcsd]: finished",
                                                            "  job 1: models=[retnet]: finished"]


@pytest.mark.slow
def test_an_interrupted_run_ends_130_in_wandb_and_its_resumed_run_keeps_its_id_group_and_name(tmp_path: Path) -> None:
    """Ctrl-C: the W&B run ends with the process's 130 and says at which step; resumed, the run
    goes on as the same W&B run (id), in the same group, under the same name, and ends 0."""
    process, stderr, run = start_then_signal(tmp_path, signal.SIGINT, "logger=wandb")
    assert process.returncode == 130, stderr[-2000:]
    (path,) = find_wandb_runs(run)
    stopped = read_wandb_run(path)
    step = read_checkpoint(latest_checkpoint(run))["global_step"]
    assert (stopped.exit_code, stopped.summary["status"], stopped.summary["interrupted_at_step"]) == (
        130, "interrupted", step)
    before = set((tmp_path / "logs" / "train" / "runs").iterdir())
    result = run_here("mcsd-train", f"resume={run}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (resumed_dir,) = set((tmp_path / "logs" / "train" / "runs").iterdir()) - before
    (path,) = find_wandb_runs(resumed_dir)
    resumed = read_wandb_run(path)
    assert (resumed.id, resumed.group, resumed.name, resumed.exit_code) == (stopped.id, stopped.group, stopped.name, 0)
    assert resumed.summary["status"] == "finished"
    assert f"upload with `wandb sync {stopped.path.parent} {resumed.path.parent}`" in result.stdout  # both lives
