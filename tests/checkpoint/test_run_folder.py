"""The one reader of a run folder: each file a run writes read back, and nothing where the run
wrote nothing."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from mcsd.checkpoint.run_folder import RunFolder, csv_logs, data_files, model_node_of, write_result

MODEL = {"_target_": "mcsd.models.mcsd.MCSDConfig", "hidden_size": 24}


def write_run(run: Path, versions: int = 1) -> None:
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["model=mcsd", "size=tiny"]))
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"model": MODEL, "data": {"paths": "a.txt"}}))
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"runtime": {"choices": {"data": "local"}}}}))
    for version in range(versions):
        log = run / "csv" / f"version_{version}"
        log.mkdir(parents=True)
        (log / "metrics.csv").write_text(f"step,val/ppl\n10,{5 + version}\n20,{4 + version}\n")
        (log / "hparams.yaml").write_text(yaml.safe_dump({"model": {**MODEL, "hidden_size": 24 + version}}))
    (run / "checkpoints").mkdir()
    for step in (100, 20):
        (run / "checkpoints" / f"step-{step:06d}.ckpt").write_bytes(b"")
    (run / "result.json").write_text(json.dumps({"val_ppl": 4.0}))


def test_each_file_of_a_run_is_read(tmp_path: Path) -> None:
    write_run(tmp_path / "run", versions=2)
    run = RunFolder(tmp_path / "run")
    assert run.overrides() == ["model=mcsd", "size=tiny"]
    assert run.config()["data"] == {"paths": "a.txt"}
    assert run.choices() == {"data": "local"}
    assert [path.parent.name for path in run.metrics_files()] == ["version_0", "version_1"]
    assert run.metrics() == [{"step": "10", "val/ppl": "6"}, {"step": "20", "val/ppl": "5"}]  # the latest version's
    assert run.logged_config()["model"]["hidden_size"] == 25
    assert run.model_node() == {**MODEL, "hidden_size": 25}  # the logged config's, before the composed one's
    assert run.result() == {"val_ppl": 4.0, "status": "finished"}  # written before results said how a run ended
    assert run.holds_a_run() == ["checkpoints", "csv", "result.json"]
    assert run.latest_checkpoint() == tmp_path / "run" / "checkpoints" / "step-000100.ckpt"
    (tmp_path / "run" / "checkpoints" / "last.ckpt").mkdir()  # a sharded checkpoint is a folder
    assert run.latest_checkpoint() == tmp_path / "run" / "checkpoints" / "last.ckpt"


def test_a_folder_that_holds_nothing_reads_as_nothing(tmp_path: Path) -> None:
    for run in (RunFolder(tmp_path), RunFolder(tmp_path / "absent")):
        assert run.overrides() is None and run.config() is None and run.choices() is None
        assert run.metrics_files() == [] and run.metrics() == [] and run.logged_config() is None
        assert run.model_node() is None and run.result() is None and run.latest_checkpoint() is None
        assert run.holds_a_run() == []


def test_a_result_says_how_the_run_ended_and_a_refused_run_holds_no_run(tmp_path: Path) -> None:
    write_result(tmp_path, {"status": "refused", "reason": "optimizer.lr=-1 must be 0 or more", "val_ppl": float("nan")})
    assert RunFolder(tmp_path).result() == {"status": "refused", "reason": "optimizer.lr=-1 must be 0 or more",
                                            "val_ppl": None}
    assert RunFolder(tmp_path).holds_a_run() == []  # a refused sweep job's folder: its job may run there again
    (tmp_path / "result.json").write_text(json.dumps({"diverged_at_step": 7, "val_ppl": None}))  # an older diverged run
    assert RunFolder(tmp_path).result()["status"] == "diverged" and RunFolder(tmp_path).holds_a_run() == ["result.json"]


def test_an_empty_overrides_file_is_no_overrides(tmp_path: Path) -> None:
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("[]\n")
    assert RunFolder(tmp_path).overrides() == []


def test_csv_logs_finds_every_run_of_a_sweep_with_its_config(tmp_path: Path) -> None:
    for job in ("0", "1"):
        write_run(tmp_path / job)
    (tmp_path / "2" / "csv" / "version_0").mkdir(parents=True)  # a log without its config is skipped
    (tmp_path / "2" / "csv" / "version_0" / "metrics.csv").write_text("step\n")
    logs = csv_logs(tmp_path)
    assert [path.relative_to(tmp_path).parts[0] for path, _ in logs] == ["0", "1"]
    assert all(config["model"] == MODEL for _, config in logs)


def test_model_node_of_a_file_or_a_folder(tmp_path: Path) -> None:
    write_run(tmp_path / "run")
    assert model_node_of(tmp_path / "run") == MODEL
    assert model_node_of(tmp_path / "run" / ".hydra" / "config.yaml") == MODEL
    (tmp_path / "node.yaml").write_text(yaml.safe_dump(MODEL))
    assert model_node_of(tmp_path / "node.yaml") == MODEL
    (tmp_path / "other.yaml").write_text(yaml.safe_dump({"data": {}}))
    assert model_node_of(tmp_path / "other.yaml") is None


def test_data_files_of_every_spelling() -> None:
    assert data_files(None) == [] and data_files({}) == []
    assert data_files({"paths": "a.txt"}) == ["a.txt"]
    assert data_files({"paths": ["a.txt", "b.txt"]}) == ["a.txt", "b.txt"]
    assert data_files({"paths": {"train": ["a.txt", "b.txt"], "val": "c.txt", "test": None}}) == ["a.txt", "b.txt", "c.txt"]
