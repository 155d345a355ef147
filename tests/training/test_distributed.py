"""Paper scale on this machine's CPUs: FSDP2 over 2 gloo processes trains as one process does,
its sharded (DCP) checkpoints resume exactly on 2 and on 1 process (and a one-process checkpoint on
2), load with ``mcsd.load``, and refuse in one line when they are not whole; the memory plan
refuses the paper's 10B model here without allocating it; activation checkpointing gives the
same losses; SLURM's resources follow the trainer."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import DictConfig

import mcsd
from helpers.runs import FAST, compose_train, read_metrics, run_cli, run_here, series, train_refusal
from mcsd.training.run import train

RUN = [*FAST, "logger=csv", "test_after_training=false"]
FSDP = ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2", "data.batch_size=4"]
DDP = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "data.batch_size=4"]
SINGLE = ["data.batch_size=8"]  # the same global batch on one process


def only_run(log_dir: Path) -> Path:
    (run,) = (log_dir / "train" / "runs").iterdir()
    return run


def losses(run: Path) -> dict[str, dict[int, float]]:
    rows = read_metrics(run)
    return {key: series(rows, key) for key in ("train/loss", "val/loss")}


def assert_same_losses(actual: dict[str, dict[int, float]], expected: dict[str, dict[int, float]]) -> None:
    """``actual``'s losses at every step it logged equal ``expected``'s there (<= 1e-5 relative)."""
    for key, values in actual.items():
        assert values, key
        for step, value in values.items():
            assert value == pytest.approx(expected[key][step], rel=1e-5), (key, step)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(cwd, a 2-process FSDP run, the same run on one process), 6 steps, checkpoints at 3 and 6."""
    cwd = tmp_path_factory.mktemp("distributed")
    for name, overrides, run in (("fsdp", FSDP, run_cli), ("single", SINGLE, run_here)):  # one process: this one
        result = run("mcsd-train", *RUN, *overrides, f"paths.log_dir={name}", cwd=cwd)
        assert result.returncode == 0, result.stderr[-3000:]
    return cwd, only_run(cwd / "fsdp"), only_run(cwd / "single")


@pytest.mark.slow
def test_fsdp_on_two_processes_trains_as_one_process_does(runs: tuple[Path, Path, Path]) -> None:
    """Same seed, same global batch: the sharded run's losses are the single process's (its shards
    start from exactly the weights one process draws), and it writes sharded checkpoints."""
    _, fsdp, single = runs
    assert_same_losses(losses(fsdp), losses(single))
    assert sorted(losses(fsdp)["train/loss"]) == list(range(6))
    checkpoint = fsdp / "checkpoints" / "step-000003.ckpt"
    assert checkpoint.is_dir() and sorted(path.name for path in checkpoint.glob("*.distcp")) == ["__0_0.distcp",
                                                                                               "__1_0.distcp"]
    assert not list((fsdp / "checkpoints").glob(".*"))  # no staging folder left
    assert len(list((fsdp / "memory").glob("process-*.json"))) == 2


@pytest.mark.slow
def test_fsdp_trains_mqar_as_one_process_does(tmp_path: Path) -> None:
    """MQAR's loss (the LM head at the labelled positions alone) goes through the model's forward,
    so FSDP2 gathers the root's weights: 2 sharded processes log one process's losses and accuracy."""
    mqar = [*RUN, "data=mqar", "model.num_layers=2", "data.seq_len=32", "data.num_pairs=4", "data.num_train=64",
            "data.num_val=16", "trainer.max_steps=2", "trainer.val_check_interval=2", "scheduler.warmup_steps=1",
            "validate_before_training=false"]
    result = run_cli("mcsd-train", *mqar, *FSDP, "paths.log_dir=fsdp", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    train(compose_train(tmp_path / "single", *mqar, *SINGLE))
    sharded, single = (read_metrics(run) for run in (only_run(tmp_path / "fsdp"), tmp_path / "single"))
    for key in ("train/loss", "val/loss", "val/mqar_acc"):
        assert series(sharded, key) and series(sharded, key) == pytest.approx(series(single, key), rel=1e-5), key


@pytest.mark.slow
def test_sharded_checkpoints_and_the_final_folder_load_on_one_process(runs: tuple[Path, Path, Path]) -> None:
    _, fsdp, single = runs
    ids = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(1))
    sharded, final = mcsd.load(fsdp / "checkpoints" / "last.ckpt")(ids), mcsd.load(fsdp / "model")(ids)
    torch.testing.assert_close(sharded, final, rtol=0, atol=0)  # the same weights, gathered or read from DCP
    torch.testing.assert_close(final, mcsd.load(single / "model")(ids), rtol=1e-5, atol=1e-5)
    assert mcsd.load(fsdp)(ids).equal(final)  # the run directory: its model folder
    assert mcsd.load_tokenizer(fsdp / "checkpoints" / "step-000003.ckpt").get_vocab_size() == 512


@pytest.mark.slow
@pytest.mark.parametrize(("source", "overrides"), [("fsdp", []), ("fsdp", ["trainer=cpu"]), ("single", FSDP),
                                                   ("single", DDP)], ids=["2->2", "2->1", "1->2", "1->2 ddp"])
def test_a_checkpoint_resumes_exactly_on_two_or_one_process(runs: tuple[Path, Path, Path], source: str,
                                                            overrides: list[str]) -> None:
    """From step 3, on the same number of processes or another (FSDP2, or DDP reading the same
    token shards): the losses of the unbroken run. The global batch is kept by itself (4 per
    process on 2, 8 on 1), and the count of tokens goes on over every process's share."""
    cwd, fsdp, single = runs
    run = {"fsdp": fsdp, "single": single}[source]
    log_dir = f"resumed-{source}-to-{overrides[0].split('=')[1] if overrides else 'same'}"
    run_command = run_here if overrides == ["trainer=cpu"] else run_cli  # one process: this one
    result = run_command("mcsd-train", f"ckpt_path={run / 'checkpoints' / 'step-000003.ckpt'}", *overrides,
                     f"paths.log_dir={log_dir}", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = losses(only_run(cwd / log_dir))
    assert sorted(resumed["train/loss"]) == [3, 4, 5]
    assert_same_losses(resumed, losses(single))
    assert series(read_metrics(only_run(cwd / log_dir)), "trainer/tokens")[3] == 4 * 8 * 64  # steps * global batch * seq_len
    assert (only_run(cwd / log_dir) / "model" / "model.safetensors").is_file()


@pytest.mark.slow
def test_bad_sharded_input_fails_in_one_line(runs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """fsdp on one device; a sharded checkpoint with a process's file missing, or truncated; a
    sharded checkpoint resumed into another size or architecture. Nothing of the run is touched."""
    cwd, fsdp, _ = runs
    source = fsdp / "checkpoints" / "step-000003.ckpt"
    missing, truncated = tmp_path / "missing.ckpt", tmp_path / "truncated.ckpt"
    for copy in (missing, truncated):
        copy.mkdir()
        for file in source.iterdir():
            (copy / file.name).write_bytes(file.read_bytes())
    (missing / "__1_0.distcp").unlink()
    shard = truncated / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    before = {path: path.stat().st_mtime_ns for path in fsdp.rglob("*")}
    one_device = run_here("mcsd-train", *RUN, "trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=1",
                          "paths.log_dir=bad", cwd=cwd)
    errors = [line for line in one_device.stderr.splitlines() if line.startswith("mcsd-train: error:")]
    assert one_device.returncode == 2 and len(errors) == 1 and "Traceback" not in one_device.stderr
    assert ("trainer=fsdp shards the model over processes, but trainer.devices=1 x trainer.num_nodes=1 makes one"
            in errors[0]), one_device.stderr[-2000:]
    # The checkpoint's refusals, as the command's task gives them (in this process).
    cases = [
        ([f"ckpt_path={missing}"], f"{missing} is not a whole sharded checkpoint (__1_0.distcp is missing)"),
        ([f"ckpt_path={truncated}"], f"{truncated} is not a whole sharded checkpoint (__0_0.distcp is truncated: 100 of"),
        ([f"ckpt_path={source}", "size=small"], "the overrides change the model (embed.weight: (512, 64) in the "
                                                "checkpoint, (4096, 128) now)"),
        ([f"ckpt_path={source}", "model=transformer"], "that run trained MCSD (model=mcsd), and model=transformer asks "
                                                       "for Transformer; a resumed run keeps its model"),
        ([f"init_from={missing}", *RUN], f"{missing} is not a whole sharded checkpoint (__1_0.distcp is missing)"),
    ]
    for number, (overrides, message) in enumerate(cases):
        assert message in train_refusal(cwd / "bad" / str(number), *overrides)
    assert not list((cwd / "bad").rglob("*.ckpt"))
    assert {path: path.stat().st_mtime_ns for path in fsdp.rglob("*")} == before


def test_the_paper_size_is_refused_by_its_memory_plan_without_allocating(tmp_path: Path) -> None:
    """size=10b under trainer=fsdp on this machine's CPUs: built on the meta device, planned per
    process (10.1B fp32 parameters over 2 processes: 18.9 GiB of shards each, before gradients and
    AdamW), refused in one line with the numbers, not killed for memory."""
    result = run_here("mcsd-train", "size=10b", *FSDP, cwd=tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("mcsd-train: error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-2000:]
    count = mcsd.count_parameters({"_target_": "mcsd.models.mcsd.MCSDConfig", "vocab_size": 50304, "hidden_size": 3072,
                                   "num_channels": 12, "num_layers": 60, "mlp_hidden_size": 15360})
    shard = f"{4 * count // 2 / 2**30:.2f}"
    assert ("this run cannot fit: memory plan, process 0 (sharded over 2 processes): " in errors[0]
            and f"parameters {shard} + gradients {shard} + optimizer {f'{8 * count // 2 / 2**30:.2f}'}" in errors[0])


@pytest.mark.parametrize("model", ["mcsd", "transformer"])
def test_activation_checkpointing_gives_the_same_losses(tmp_path: Path, model: str) -> None:
    """model.activation_checkpointing=true trains to the same losses (the conformance suite checks
    the gradients of every form of every architecture)."""
    results = []
    for checkpointing in ("false", "true"):
        run_dir = tmp_path / checkpointing
        train(compose_train(run_dir, *RUN, f"model={model}", "trainer.max_steps=3", "validate_before_training=false",
                            f"model.activation_checkpointing={checkpointing}"))
        results.append(series(read_metrics(run_dir), "train/loss"))
    assert len(results[0]) == 3 and results[0] == results[1]


def slurm_launcher(*overrides: str) -> DictConfig:
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        return compose("train", overrides=[*overrides, "hydra/launcher=slurm"], return_hydra_config=True).hydra.launcher


def test_slurm_resources_follow_the_trainer() -> None:
    for trainer, devices, gpus in (("ddp", 2, 2), ("fsdp", 8, 8), ("cpu", 1, 0)):
        launcher = slurm_launcher(f"trainer={trainer}")
        assert (launcher.tasks_per_node, launcher.nodes, launcher.gpus_per_node) == (devices, 1, gpus)
    launcher = slurm_launcher("trainer=fsdp", "trainer.devices=4", "trainer.num_nodes=3")
    assert (launcher.tasks_per_node, launcher.nodes, launcher.gpus_per_node) == (4, 3, 4)


def fake_command(folder: Path, name: str, log: Path, status: int = 0) -> None:
    """An executable ``name`` in ``folder`` that appends its arguments to ``log``."""
    script = folder / name
    script.write_text(f"#!/bin/sh\necho {name} \"$@\" >> {log}\nexit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_slurm_resources_given_by_hand_that_disagree_are_refused_before_submitting(tmp_path: Path) -> None:
    bin_dir, log = tmp_path / "bin", tmp_path / "sbatch.log"
    bin_dir.mkdir()
    fake_command(bin_dir, "sbatch", log)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    for overrides, message in (
        (["trainer=ddp", "hydra.launcher.tasks_per_node=4"], "hydra.launcher.tasks_per_node=4 but trainer.devices=2"),
        (["trainer=fsdp", "hydra.launcher.nodes=2"], "hydra.launcher.nodes=2 but trainer.num_nodes=1"),
        (["trainer=gpu", "hydra.launcher.gpus_per_node=0"], "hydra.launcher.gpus_per_node=0 but trainer.devices=1"),
    ):
        result = run_here("mcsd-train", "-m", "hydra/launcher=slurm", *overrides, cwd=tmp_path, env=env)
        errors = [line for line in result.stderr.splitlines() if line.startswith("mcsd-train: error:")]
        assert result.returncode == 2 and len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert not log.exists()  # nothing was submitted


@pytest.mark.slow
def test_bf16_compute_under_fsdp_trains_close_to_fp32(runs: tuple[Path, Path, Path]) -> None:
    """trainer.strategy.mixed_precision=bf16 (auto's choice on GPUs): bf16 gathered weights under
    autocast, fp32 reduction and master weights; on gloo CPUs here. Its losses stay within 1% of fp32's."""
    cwd, fsdp, _ = runs
    result = run_cli("mcsd-train", *RUN, *FSDP, "trainer.strategy.mixed_precision=bf16", "paths.log_dir=bf16", cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    bf16, fp32 = losses(only_run(cwd / "bf16")), losses(fsdp)
    assert sorted(bf16["val/loss"]) == sorted(fp32["val/loss"])
    for step, value in bf16["val/loss"].items():
        assert value == pytest.approx(fp32["val/loss"][step], rel=1e-2) and value != fp32["val/loss"][step]


def test_fsdp_on_one_process_is_refused_on_cpus_and_runs_on_a_gpu() -> None:
    """One process gains nothing from sharding on a CPU (refused in one line); on a GPU it is the
    bf16 path a larger machine shards, and ``pytest -m gpu`` runs it on a machine with one GPU."""
    from mcsd.errors import MCSDError
    from mcsd.training.fsdp import check_processes

    check_processes(1, 1, "cuda")
    check_processes(2, 1, "cpu")
    check_processes(1, 2, "cpu")
    with pytest.raises(MCSDError, match="^trainer=fsdp shards the model over processes, but trainer.devices=1 x "
                                        "trainer.num_nodes=1 makes one: use trainer.devices=2 or more"):
        check_processes(1, 1, "cpu")
