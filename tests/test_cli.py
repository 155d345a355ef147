"""mcsd-train as a user runs it: multirun sweeps, DDP, and one-line errors for bad input."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import FAST, read_metrics, run_cli, series, train_refusal
from mcsd.models import registry

QUICK = [*FAST, "trainer.max_steps=2", "trainer.val_check_interval=2", "test_after_training=false"]


def test_multirun_gives_every_job_its_own_run(tmp_path: Path) -> None:
    result = run_cli("mcsd-train", "-m", "model=mcsd,transformer", *QUICK, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    sweeps = list((tmp_path / "logs" / "train" / "multiruns").iterdir())
    assert len(sweeps) == 1
    jobs = sorted(path for path in sweeps[0].iterdir() if path.is_dir() and path.name.isdigit())
    assert [job.name for job in jobs] == ["0", "1"]
    wandb_ids = set()
    for job, model in zip(jobs, ["mcsd", "transformer"]):
        assert (job / ".hydra" / "overrides.yaml").read_text().count(f"model={model}") == 1
        assert len(series(read_metrics(job), "train/loss")) == 2
        runs = list((job / "wandb").glob("offline-run-*"))
        assert len(runs) == 1
        wandb_ids.add(runs[0].name.rsplit("-", 1)[1])
        assert (job / "model" / "config.json").read_text().count(model.replace("mcsd", "MCSD").replace(
            "transformer", "Transformer")) == 1
    assert len(wandb_ids) == 2


def test_runs_started_together_get_distinct_directories(tmp_path: Path) -> None:
    """Two runs started in the same second write to different run directories."""
    script = Path(sys.executable).parent / "mcsd-train"
    processes = [subprocess.Popen([str(script), *QUICK, "logger=none", "validate_before_training=false"], cwd=tmp_path,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
    for process in processes:
        assert process.wait(timeout=300) == 0
    runs = list((tmp_path / "logs" / "train" / "runs").iterdir())
    assert len(runs) == 2 and all((run / "model" / "model.safetensors").is_file() for run in runs)


def test_ddp_on_two_cpu_processes(tmp_path: Path) -> None:
    result = run_cli("mcsd-train", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "logger=csv",
                     *QUICK, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    tokens = series(read_metrics(run), "trainer/tokens")
    assert tokens[1] == 2 * 2 * 8 * 64  # steps * processes * batch * seq_len
    assert (run / "model" / "model.safetensors").is_file()


def test_ddp_resume_continues_exactly(tmp_path: Path) -> None:
    """Under DDP (two CPU processes, each its share of every epoch) a run resumed from step 3
    logs the losses of the uninterrupted run for every remaining step."""
    ddp = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "logger=csv", *QUICK,
           "trainer.max_steps=6", "callbacks.model_checkpoint.every_n_train_steps=1"]
    whole = run_cli("mcsd-train", *ddp, "paths.log_dir=whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    (run,) = (tmp_path / "whole" / "train" / "runs").iterdir()
    checkpoint = run / "checkpoints" / "step-000003.ckpt"
    resumed = run_cli("mcsd-train", *ddp, "paths.log_dir=resumed", f"ckpt_path={checkpoint}", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (resumed_run,) = (tmp_path / "resumed" / "train" / "runs").iterdir()
    whole_loss, resumed_loss = series(read_metrics(run), "train/loss"), series(read_metrics(resumed_run), "train/loss")
    assert sorted(resumed_loss) == [3, 4, 5]
    assert resumed_loss == {step: whole_loss[step] for step in resumed_loss}


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 4-step run of the tiny model (checkpoints at step 3 and last.ckpt): (cwd, run dir)."""
    cwd = tmp_path_factory.mktemp("stopped")
    result = run_cli("mcsd-train", *QUICK, "trainer.max_steps=4", "logger=csv", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (cwd / "logs" / "train" / "runs").iterdir()
    return cwd, run


def newest_run(cwd: Path, before: set[Path]) -> Path:
    (run,) = set((cwd / "logs" / "train" / "runs").iterdir()) - before
    return run


@pytest.mark.parametrize("how", ["ckpt_path", "resume"])
def test_resume_needs_no_overrides_repeated(stopped_run: tuple[Path, Path], how: str) -> None:
    """`ckpt_path=RUN/checkpoints/last.ckpt` or `resume=RUN` alone: the run's own overrides come
    back (size=tiny, its data and logger settings); this command's go on top (max_steps)."""
    cwd, run = stopped_run
    before = set((cwd / "logs" / "train" / "runs").iterdir())
    target = f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}" if how == "ckpt_path" else f"resume={run}"
    result = run_cli("mcsd-train", target, "trainer.max_steps=6", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = newest_run(cwd, before)
    assert sorted(series(read_metrics(resumed), "train/loss")) == [3, 4, 5]
    hparams = yaml.safe_load((resumed / "csv" / "version_0" / "hparams.yaml").read_text())
    assert hparams["choices"]["size"] == "tiny" and hparams["model"]["hidden_size"] == 64
    assert hparams["data"]["seq_len"] == 64 and not (resumed / "wandb").exists()  # logger=csv came back
    assert hparams["ckpt_path"] == str(run / "checkpoints" / "last.ckpt")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.hidden_size=128"], "the overrides change the model (embed.weight: (512, 64) in the checkpoint, "
                                    "(512, 128) now); a resumed run keeps its model: drop the model/size overrides"),
        (["ablation=slope_only"], "the overrides change the model (layers.0.mixer.sections.1.norm.weight: (4, 16) in "
                                   "the checkpoint, None now)"),
    ],
)
def test_resume_refuses_a_different_model_in_one_line(stopped_run: tuple[Path, Path], tmp_path: Path,
                                                      overrides: list[str], message: str) -> None:
    _, run = stopped_run
    before = _snapshot(run)
    assert message in train_refusal(tmp_path / "run", f"resume={run}", *overrides)
    assert _snapshot(run) == before


def _snapshot(directory: Path) -> dict[str, str]:
    return {str(path): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A finished run in the working directory, which the bad commands below must not touch."""
    cwd = tmp_path_factory.mktemp("cwd")
    result = run_cli("mcsd-train", *QUICK, "logger=csv", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (cwd / "logs" / "train" / "runs").iterdir()
    return cwd, _snapshot(run)


@pytest.fixture(scope="module")
def bad_inputs(earlier_run: tuple[Path, dict[str, str]]) -> Path:
    """The earlier run's working directory with the files the bad commands below name."""
    cwd, _ = earlier_run
    (cwd / "empty.txt").write_text("  \n")
    (cwd / "small.txt").write_text("a few words, far fewer than one block of 512 tokens.\n" * 5)
    (cwd / "latin1.txt").write_bytes("Un caf\u00e9 ? Un th\u00e9.\n".encode("latin-1") * 50)
    (cwd / "garbage.ckpt").write_bytes(bytes(range(256)) * 20)
    (earlier,) = (cwd / "logs" / "train" / "runs").iterdir()
    checkpoint = (earlier / "checkpoints" / "last.ckpt").read_bytes()
    (cwd / "truncated.ckpt").write_bytes(checkpoint[: len(checkpoint) // 2])
    return cwd


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data=text_files", "data.paths=[missing.txt]"], "data.paths: missing.txt does not exist"),
        (["data=wikitext103"], "data=wikitext103 needs the Hugging Face Hub, which is unreachable from here: use "
                               "data=text_files"),
        (["data=text_files"], "data.paths is missing: give it on the command line (data.paths=...)"),
        (["size=huge"], "size=huge is not an option of size: use one of 1.6b, 10b, 3b, base, small, tiny"),
        (["-m", "model=mcsd,rnn"],
         f"model=rnn is not an option of model: use one of {', '.join(sorted(registry.architectures()))}"),
    ],
)
def test_bad_input_fails_in_one_line_and_keeps_earlier_runs(
    earlier_run: tuple[Path, dict[str, str]], bad_inputs: Path, overrides: list[str], message: str
) -> None:
    """The command: a bad option refused before Hydra starts, a missing value, a setting that
    cannot work once the run has its folder; one line, no traceback, no run folder left."""
    cwd, before = earlier_run
    (earlier,) = (cwd / "logs" / "train" / "runs").iterdir()
    # A closed local port stands in for the Hub, so that this test never reaches the network.
    result = run_cli("mcsd-train", *FAST, *overrides, cwd=cwd, env={"HF_ENDPOINT": "http://127.0.0.1:9"},
                     timeout=300)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("mcsd-train: error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert list((cwd / "logs" / "train" / "runs").iterdir()) == [earlier]  # no run folder left behind
    assert _snapshot(earlier) == before


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data=text_files", "data.paths=[empty.txt]"], "data=text_files: the corpus has no text"),
        (["data=text_files", "data.paths=[small.txt]", "data.sample_by=line", "data.seq_len=512"],
         "data.seq_len=512 is too long for this corpus"),
        (["trainer.max_steps=-5"], "trainer.max_steps=-5 must be a positive number of steps"),
        (["model=transformer", "ablation=slope_only"], "model.sections is a setting of mcsd, not of transformer"),
        (["+logger.extra.save_dir=x"], "logger.extra has no _target_"),
        (["ckpt_path=nowhere.ckpt"], "ckpt_path=nowhere.ckpt does not exist"),
        (["ckpt_path=garbage.ckpt"], "garbage.ckpt is not a readable checkpoint (truncated or corrupt): use another"),
        (["ckpt_path=truncated.ckpt"], "truncated.ckpt is not a readable checkpoint (truncated or corrupt)"),
        (["data=text_files", "data.paths=[latin1.txt]"], "latin1.txt is not UTF-8 text (byte 6: b'\\xe9'): convert it"),
        (["data.num_proc=0"], "data.num_proc=0 must be a positive number of processes"),
        (["resume=nowhere"], "resume=nowhere holds no checkpoints/*.ckpt: give an mcsd-train run directory"),
    ],
)
def test_settings_that_cannot_work_fail_in_one_line(
    earlier_run: tuple[Path, dict[str, str]], bad_inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    overrides: list[str], message: str
) -> None:
    """The one line each prints (the command's task in this process: the case above shows the
    command itself ends such a line with no run folder left); the earlier run untouched."""
    cwd, before = earlier_run
    monkeypatch.chdir(cwd)
    assert message in train_refusal(tmp_path / "run", *FAST, *overrides)
    (earlier,) = (cwd / "logs" / "train" / "runs").iterdir()
    assert _snapshot(earlier) == before


def test_slurm_launcher_without_sbatch_fails_in_one_line(tmp_path: Path) -> None:
    """A PATH without sbatch (only the venv's bin/) stands for a machine without SLURM."""
    result = run_cli("mcsd-train", "hydra/launcher=slurm", *QUICK, cwd=tmp_path,
                     env={"PATH": str(Path(sys.executable).parent)})
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("mcsd-train: error:")]
    assert len(errors) == 1 and "hydra/launcher=slurm submits to SLURM, but there is no sbatch here" in errors[0]
    assert "Traceback" not in result.stderr and not (tmp_path / "logs").exists()


def test_online_wandb_without_a_key_and_missing_ckpt_fail_in_one_line(tmp_path: Path) -> None:
    no_key = {"WANDB_MODE": "online", "WANDB_API_KEY": None, "HOME": str(tmp_path)}  # no ~/.netrc either
    cases = [
        (run_cli("mcsd-train", *QUICK, cwd=tmp_path, env=no_key), "mcsd-train",
         "logger.wandb uses W&B online but no W&B API key is set: run `wandb login`"),
        (run_cli("mcsd-plot", "ablation", "--wandb", "me/mcsd", "--group", "g", cwd=tmp_path, env=no_key), "mcsd-plot",
         "--wandb uses W&B online but no W&B API key is set"),
        (run_cli("mcsd-generate", cwd=tmp_path), "mcsd-generate", "ckpt is missing: give it on the command line"),
        (run_cli("mcsd-eval", "tasks=local", cwd=tmp_path), "mcsd-eval", "ckpt is missing: give it on the command line"),
    ]
    for result, app, message in cases:
        assert result.returncode == 2, result.stderr[-2000:]
        errors = [line for line in result.stderr.splitlines() if line.startswith(f"{app}: error:")]
        assert len(errors) == 1 and message in errors[0] and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").rglob("*.yaml"))  # no run folders


def test_a_run_prints_no_third_party_warnings(tmp_path: Path) -> None:
    """No deprecation notes of dependencies, no Lightning tips, no W&B note about a setting we
    never set: what a run prints on stderr is progress and its own messages."""
    result = run_cli("mcsd-train", *QUICK, cwd=tmp_path)  # W&B (offline) + CSV, the default loggers
    assert result.returncode == 0, result.stderr[-3000:]
    noise = [line for line in result.stderr.splitlines()
             if "warn" in line.lower() or "deprecated" in line or "Tip:" in line or "anonymous" in line
             or "was configured so 100%" in line or "weights_only" in line]
    assert noise == []
