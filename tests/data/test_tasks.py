"""``data=mad`` and ``data=retrieval`` (mcsd/data/tasks.py): the splits, their seeds and lengths,
the refusals, and a training run that logs its task's accuracy at the training length and past it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from helpers import ROOT
from helpers.runs import FAST, compose_train, read_metrics, series, train_refusal
from hydra_plugins.mcsd_arms_sweeper import registry_arms
from mcsd.checkpoint.lightning_checkpoint import read_checkpoint
from mcsd.checkpoint.saved_model import load as load_model
from mcsd.training.run import train
from mcsd.data import TaskDataModule
from mcsd.data.corpus import DataError
from mcsd.data.mad import MAD_TASKS, in_context_recall
from mcsd.data.mqar import prediction_accuracy
from mcsd.data.retrieval import RETRIEVAL_TASKS
from mcsd.data.tasks import TASKS
from mcsd.models import registry
from mcsd.plots.runs import split_curve
from mcsd.plots.tasks import load_task_runs, plot_tasks
from mcsd.training.compression import CompressionDecoder


def test_splits_are_the_tasks_drawn_from_seeds_of_their_own() -> None:
    """Train with MAD's training labels, validation and test with its test labels, each from its
    own seed; a test split at each longer length; the same seed gives the same splits."""
    def splits(seed: int) -> TaskDataModule:
        module = TaskDataModule(task="in_context_recall", vocab_size=16, seq_len=32, num_train=64, num_val=16,
                                batch_size=8, seed=seed, test_lengths=[32, 64])
        module.build()
        return module

    first, again, other = splits(0), splits(0), splits(1)
    assert [len(first.splits[name]) for name in ("train", "val", "test")] == [64, 16, 16]
    assert list(first.longer_tests) == [64] and first.longer_tests[64].inputs.shape == (16, 64)
    for name in ("train", "val", "test"):
        assert torch.equal(first.splits[name].inputs, again.splits[name].inputs)
        assert not torch.equal(first.splits[name].inputs, other.splits[name].inputs)
    train_split, val_split = first.splits["train"], first.splits["val"]
    assert (train_split.labels[:, :-1] == train_split.inputs[:, 1:]).all()  # every next token
    assert (val_split.labels != -100).float().mean() < 0.5  # the repeated keys' values alone
    assert not torch.equal(val_split.inputs, first.splits["test"].inputs)
    assert first.accuracy_metric == "in_context_recall_acc"


@pytest.mark.parametrize(("settings", "message"), [
    ({"task": "copying"}, "data.task='copying' is unknown: use one of in_context_recall"),
    ({"num_train": 4, "batch_size": 8}, "data.num_train=4 is fewer than data.batch_size=8"),
    ({"test_lengths": [16]}, "data.test_lengths=[16] must be at least data.seq_len=32"),
])
def test_settings_it_cannot_take_are_refused_in_one_line(settings: dict, message: str) -> None:
    with pytest.raises(DataError, match=re.escape(message)):
        TaskDataModule(**{"vocab_size": 16, "seq_len": 32, **settings})


def test_a_task_setting_the_generator_cannot_take_fails_before_any_run_starts(tmp_path: Path) -> None:
    message = train_refusal(tmp_path / "run", "data=mad", "data.task=in_context_recall", "data.seq_len=33")
    assert "data.seq_len=33 must be even for in-context recall" in message
    assert not (tmp_path / "run").exists()


def test_training_logs_the_tasks_accuracy_at_its_length_and_past_it(tmp_path: Path) -> None:
    """``data=retrieval`` trains on the passkey at 32 tokens and tests at 32 and 64: the logged
    test accuracies are the saved model's, computed here from the same splits."""
    run_dir = tmp_path / "run"
    cfg = compose_train(run_dir, *FAST, "data=retrieval", "data.task=passkey", "data.seq_len=32",
                        "data.num_train=64", "data.num_val=16", "data.batch_size=8", "data.test_lengths=[64]",
                        "model.vocab_size=32", "trainer.limit_val_batches=null",
                        "logger=csv")
    train(cfg)
    rows = read_metrics(run_dir)
    module = TaskDataModule(task="passkey", vocab_size=32, seq_len=32, num_train=64, num_val=16, batch_size=8,
                            seed=cfg.seed, test_lengths=[64])
    module.build()
    model = load_model(run_dir / "model").eval()
    for split, name in ((module.splits["test"], "test/passkey_acc"), (module.longer_tests[64], "test/passkey_acc_at_64")):
        with torch.no_grad():
            predictions = model(split.inputs).argmax(-1)
        logged = series(rows, name)
        assert len(logged) == 1
        assert next(iter(logged.values())) == pytest.approx(prediction_accuracy(predictions, split.labels).mean().item(),
                                                            abs=1e-6)
    assert series(rows, "val/passkey_acc") and series(rows, "test/loss_at_64")
    saved = read_checkpoint(run_dir / "checkpoints" / "last.ckpt")  # plain types: it loads with weights_only=True
    assert saved["datamodule_hyper_parameters"]["test_lengths"] == [64]
    # mcsd-plot tasks: a row per test length, the logged accuracies, a line against the length
    runs = load_task_runs(tmp_path)
    assert list(zip(runs["length"], runs["accuracy"])) == [
        (32, next(iter(series(rows, "test/passkey_acc").values()))),
        (64, next(iter(series(rows, "test/passkey_acc_at_64").values())))]
    assert set(runs["trained_length"]) == {32} and runs["state_bytes"].iloc[0] > 0
    figure = plot_tasks(runs, tmp_path / "figure", "retrieval")
    assert [path.name for path in figure.paths] == ["retrieval.png", "retrieval.pdf", "retrieval_table.md"]
    assert "| passkey | passkey at 64 |" in figure.paths[-1].read_text()


def test_mad_recall_defaults_are_mad_labs() -> None:
    """conf/data/mad.yaml's defaults draw MAD-lab's default task: multi-query in-context recall,
    vocabulary 16, 128 tokens."""
    cfg = compose_train(Path("unused"), "data=mad")
    assert cfg.model.vocab_size == cfg.data.vocab_size == 16  # the task's vocabulary, not the size's
    assert (cfg.data.task, cfg.data.seq_len, cfg.data.num_train, cfg.data.num_val, cfg.data.batch_size) == (
        "in_context_recall", 128, 12800, 1280, 128)
    inputs, labels = in_context_recall(2, seed=0, split="test")
    assert inputs.shape == (2, 128) and (labels != -100).sum() > 2  # several queries per example


def test_compression_is_scored_by_the_decoder_the_run_trains_beside_the_model(tmp_path: Path) -> None:
    """``data.task=compression`` trains MAD's decoder with the model: the logged test accuracy is
    the checkpoint's decoder reading the saved model's last position, for every position."""
    run_dir = tmp_path / "run"
    cfg = compose_train(run_dir, *FAST, "data=mad", "data.task=compression", "data.seq_len=8",
                        "data.num_train=64", "data.num_val=16", "data.batch_size=8", "data.vocab_size=8",
                        "trainer.limit_val_batches=null", "logger=csv")
    train(cfg)
    module = TaskDataModule(task="compression", vocab_size=8, seq_len=8, num_train=64, num_val=16, batch_size=8,
                            seed=cfg.seed)
    split = module.build()["test"]
    model = load_model(run_dir / "model").eval()
    decoder = CompressionDecoder(model.config.hidden_size, 8, 8)
    weights = read_checkpoint(run_dir / "checkpoints" / "last.ckpt")["state_dict"]
    decoder.load_state_dict({key.removeprefix("decoder."): value for key, value in weights.items()
                             if key.startswith("decoder.")})
    with torch.no_grad():
        predictions = decoder(model.hidden_states(split.inputs)[:, -1]).argmax(-1)
    logged = series(read_metrics(run_dir), "test/compression_acc")
    assert next(iter(logged.values())) == pytest.approx(
        prediction_accuracy(predictions, split.labels).mean().item(), abs=1e-6)
    assert torch.equal(split.labels, split.inputs)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_each_task_config_draws_its_task_at_its_sources_settings(task: str) -> None:
    """``task=<name>`` (conf/task/) composes with its data config and draws its task at the
    vocabulary, length and settings it names; the experiments sweep every task of their source
    over every registered architecture, each model as wide in vocabulary as its task."""
    data = "mad" if task in MAD_TASKS else "retrieval"
    cfg = compose_train(Path("unused"), f"data={data}", f"task={task}")
    assert cfg.data.task == task and cfg.model.vocab_size == cfg.data.vocab_size  # the task group alone sets both
    module = TaskDataModule(task=task, vocab_size=cfg.data.vocab_size, seq_len=cfg.data.seq_len,
                            settings=cfg.data.settings, num_train=8, num_val=8, batch_size=8)
    inputs = module.build()["train"].inputs
    assert inputs.shape == (8, cfg.data.seq_len) and int(inputs.max()) < cfg.data.vocab_size
    experiment = compose_train(Path("unused"), f"experiment={data}", f"task={task}")
    assert experiment.model.vocab_size == experiment.data.vocab_size == cfg.data.vocab_size
    sweeper = yaml.safe_load((ROOT / "conf" / "experiment" / f"{data}.yaml").read_text())["hydra"]["sweeper"]
    assert set(sweeper["params"]["task"].split(",")) == set(MAD_TASKS if data == "mad" else RETRIEVAL_TASKS)
    arms = registry_arms(sweeper.get("registry_variants") or [], sweeper.get("registry_architectures"),
                         sweeper.get("registry_settings"))
    assert [arm[0] for arm in arms] == [f"model={name}" for name in registry.architectures()]


def test_the_documented_task_settings_compose() -> None:
    """docs/recall_and_comparison.md's commands: a task's settings set key by key (a dict of them
    met Hydra's "not in struct"; it is refused in one line: tests/commands/test_cli.py)."""
    copying = compose_train(Path("unused"), "data=mad", "task=selective_copying", "data.seq_len=256",
                            "data.settings.num_tokens_to_copy=32")
    assert (copying.data.settings.num_tokens_to_copy, copying.model.vocab_size) == (32, 16)
    tracking = compose_train(Path("unused"), "data=retrieval", "task=variable_tracking", "data.settings.num_chains=2",
                             "data.settings.num_hops=4")
    assert (tracking.data.settings.num_chains, tracking.data.settings.num_hops, tracking.model.vocab_size) == (2, 4, 64)


def test_the_retrieval_experiment_trains_each_task_at_the_budget_its_anchor_needs() -> None:
    """``experiment=retrieval`` gives each task the tokens where the Transformer passes it within its
    training length (the needle, one of them, twice the passkey's); ``data.token_budget`` on the
    command line sets every task's."""
    budgets = {task: compose_train(Path("unused"), "experiment=retrieval", f"task={task}").data.token_budget
               for task in sorted(RETRIEVAL_TASKS)}
    assert budgets == {"needle": 16_000_000, "passkey": 8_000_000, "variable_tracking": 8_000_000}
    needle = compose_train(Path("unused"), "experiment=retrieval", "task=needle", "data.token_budget=4000000")
    assert (needle.data.token_budget, needle.data.settings.num_needles) == (4_000_000, 1)


@pytest.mark.parametrize(("overrides", "message"), [
    (["data.task=passkey", "model.vocab_size=16", "data.vocab_size=32"],
     "model.vocab_size=16 is smaller than data.vocab_size=32, the ids of data.task=passkey"),
    (["task=compression", "trainer=fsdp"], "data.task=compression reads the model's hidden states outside"),
])
def test_a_task_the_model_cannot_take_is_refused_before_the_run(tmp_path: Path, overrides: list[str],
                                                                 message: str) -> None:
    data = "retrieval" if "data.task=passkey" in overrides else "mad"
    line = train_refusal(tmp_path / "run", f"data={data}", *overrides)
    assert message in line
    assert not (tmp_path / "run").exists()


def test_the_closing_lines_list_the_accuracies_past_the_training_length_by_length() -> None:
    """test/passkey_acc_at_1024 came before _at_512 (string order): by length now."""
    from types import SimpleNamespace

    from mcsd.training.report import end_of_run_report

    metrics = {f"test/passkey_acc_at_{length}": torch.tensor(1 / length) for length in (1024, 512, 768)}
    trainer = SimpleNamespace(overfit_batches=0, datamodule=SimpleNamespace(accuracy_metric="passkey_acc"),
                              callback_metrics=metrics, checkpoint_callback=None)
    lines = end_of_run_report(trainer, [], [], 1.0, 2.7, 100).splitlines()
    assert [line.split(":")[0] for line in lines[1:]] == [
        "final test/passkey_acc_at_512", "final test/passkey_acc_at_768", "final test/passkey_acc_at_1024"]


def test_a_rate_sweep_takes_each_points_best_rate_and_draws_accuracy_against_it(tmp_path: Path) -> None:
    """Runs of one budget at several rates: the table and bars take the best rate's mean over seeds,
    name it (starred at the grid's edge), and the rates figure is drawn; runs of other budgets (an
    anchor's unlike runs) all stay, as before the protocol."""
    import pandas as pd

    from mcsd.plots.tasks import best_task_rates, markdown_task_table

    def row(curve: str, lr: float, seed: int, accuracy: float, tokens: float = 1e6) -> dict:
        arch, variant = split_curve(curve)
        return {"run": f"{curve}{lr}{seed}{tokens}", "arch": arch, "variant": variant, "task": "in_context_recall",
                "seed": seed, "lr": lr, "trained_length": 128, "params": 1, "tokens": tokens, "state_bytes": 1024,
                "length": 128, "accuracy": accuracy, "curve": curve}
    rows = pd.DataFrame([row("mcsd|full", lr, seed, accuracy) for lr, accuracies in
                         ((1e-4, (0.1, 0.2)), (1e-3, (0.6, 0.8)), (1e-2, (0.3, 0.3))) for seed, accuracy in
                         enumerate(accuracies)]
                        + [row("transformer|default", lr, 0, accuracy) for lr, accuracy in ((1e-4, 0.2), (1e-2, 0.9))]
                        + [row("retnet|default", 1e-3, 0, 0.4, tokens) for tokens in (1e6, 2e6)])
    best = best_task_rates(rows)
    assert sorted(best.loc[best["curve"] == "mcsd|full", "accuracy"]) == [0.6, 0.8]
    assert len(best[best["curve"] == "retnet|default"]) == 2  # two budgets: both runs kept
    table = markdown_task_table(rows)
    assert "| MCSD full | 0.700 (lr 0.001) |" in table and "| Transformer | 0.900 (lr 0.01*) |" in table
    assert "| RetNet | 0.400 |" in table and "grid does not bracket it" in table
    figure = plot_tasks(rows, tmp_path, "mad")
    assert [path.name for path in figure.paths] == ["mad.png", "mad.pdf", "mad_rates.png", "mad_rates.pdf",
                                                    "mad_table.md"]
    assert len(figure.table) == len(rows)  # every run, for the table to choose from


def test_an_architecture_without_a_task_has_a_dash_in_both_tables() -> None:
    """An architecture run on one task of two: its missing cells read ``-`` in the accuracy table and
    in the state table (not ``nan``)."""
    import pandas as pd

    from mcsd.plots.tasks import markdown_task_table

    rows = pd.DataFrame([{"run": f"{curve}{task}", "arch": split_curve(curve)[0], "variant": split_curve(curve)[1],
                          "task": task, "seed": 0, "lr": 2e-3, "trained_length": 256, "params": 1, "tokens": 1e6,
                          "state_bytes": 2048, "length": 256, "accuracy": 0.5, "curve": curve}
                         for curve, tasks in (("mcsd|full", ("needle", "passkey")), ("gla|default", ("needle",)))
                         for task in tasks])
    table = markdown_task_table(rows)
    assert "| GLA | 0.500 | - |" in table and "| GLA | 2.0 | - |" in table and "nan" not in table


def test_the_recall_experiments_and_the_comparison_sweep_zoologys_four_rates() -> None:
    """The protocol lives in the configs: MQAR's, MAD's, retrieval's and the architecture comparison's
    sweeps hold zoology's grid."""
    from hydra import compose, initialize_config_module

    grid = "1.0e-4,4.64e-4,2.15e-3,1.0e-2"
    with initialize_config_module("mcsd.conf", version_base=None):
        for experiment in ("mqar_recall", "mqar_converge", "mad", "retrieval", "compare_architectures"):
            config = compose("train", overrides=[f"experiment={experiment}"], return_hydra_config=True)
            assert config.hydra.sweeper.params["optimizer.lr"] == grid, experiment


def _write_task_run(job: Path, lr: float, accuracy: float | None, status: str | None) -> None:
    """A needle run's log as ``sweep.sh`` copies it (``<job>/csv/version_0`` beside ``result.json``):
    a test accuracy where it finished (``accuracy``), none where it diverged or is still running."""
    import pandas as pd

    from helpers.models import tiny_config
    from mcsd.checkpoint.run_folder import write_result

    logs = job / "csv" / "version_0"
    logs.mkdir(parents=True)
    (logs / "hparams.yaml").write_text(yaml.safe_dump({
        "model": tiny_config("mcsd"), "optimizer": {"lr": lr}, "seed": 0, "sweep": "one",
        "data": {"task": "needle", "seq_len": 16}, "model/params": 1000}))
    metrics = {"step": [0, 10], "trainer/tokens": [0.0, 5000.0 if accuracy is None else 16000.0]}
    if accuracy is not None:
        metrics["test/needle_acc"] = [None, accuracy]
    pd.DataFrame(metrics).to_csv(logs / "metrics.csv", index=False)
    if status is not None:
        write_result(job, {"status": status, **({"diverged_at_step": 10} if status == "diverged" else {})})


def test_a_rate_that_diverged_counts_as_tried_and_loses(tmp_path: Path) -> None:
    """A diverged run logs no test accuracy; its result.json says how it ended, so its rate is one
    of those tried (the best below it is inside the grid, not starred), with the sweep's budget, no
    accuracy, and a cross in the rates figure; a run with neither (still running) is left out."""
    import pandas as pd

    from mcsd.plots.tasks import best_task_rates, markdown_task_table

    for job, (lr, accuracy, status) in enumerate([(1e-4, 0.3, "finished"), (1e-3, 0.6, "finished"),
                                                  (1e-2, None, "diverged"), (1e-1, None, None)]):
        _write_task_run(tmp_path / "runs" / str(job), lr, accuracy, status)
    rows = load_task_runs(tmp_path / "runs")
    assert sorted(rows["lr"]) == [1e-4, 1e-3, 1e-2] and set(rows["tokens"]) == {16000.0}
    assert rows.loc[rows["lr"] == 1e-2, "accuracy"].isna().all()
    best = best_task_rates(rows)
    assert (best["lr"].tolist(), best["lrs_tried"].tolist(), best["at_edge"].tolist()) == ([1e-3], [3], [False])
    assert " | 0.600 (lr 0.001) |" in markdown_task_table(rows)
    assert [path.name for path in plot_tasks(rows, tmp_path / "figure", "retrieval").paths] == [
        "retrieval.png", "retrieval.pdf", "retrieval_rates.png", "retrieval_rates.pdf", "retrieval_table.md"]
    every_rate_diverged = pd.concat([rows[rows["lr"] == 1e-2], rows[rows["lr"] == 1e-2].assign(lr=1e-1)])
    assert " | diverged (lr 0.01*) |" in markdown_task_table(every_rate_diverged)


def test_the_denormals_experiment_times_each_model_both_ways_and_counts_its_denormals(tmp_path: Path) -> None:
    """experiments/denormals/measure.py on a task's run: a row per init (trained, random) and
    setting (computed, flushed) with its times and its denormal shares; the counting is exact; its
    run.sh without the needle's trained models says what to run first, in one line."""
    import csv
    import importlib.util
    import subprocess
    import sys

    spec = importlib.util.spec_from_file_location("measure", ROOT / "experiments" / "denormals" / "measure.py")
    measure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(measure)
    assert measure._denormals(torch.tensor([0.0, 1e-40, -1e-39, 1.0, 2e-38])) == (2, 5)
    run_dir = tmp_path / "run"
    train(compose_train(run_dir, *FAST, "data=retrieval", "data.task=passkey", "data.seq_len=32", "data.num_train=64",
                        "data.num_val=16", "data.batch_size=8", "data.test_lengths=[]", "model.vocab_size=32",
                        "logger=csv"))
    result = subprocess.run([sys.executable, str(ROOT / "experiments" / "denormals" / "measure.py"), str(tmp_path / "out"),
                             str(run_dir), "--repeats", "2"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    with (tmp_path / "out" / "results.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [(row["init"], row["flush_denormal"]) for row in rows] == [
        ("trained", "False"), ("trained", "True"), ("random", "False"), ("random", "True")]
    assert all(row["arch"] == "mcsd" and row["batch"] == "8x32" and row["repeats"] == "2" for row in rows)
    assert all(0 <= float(row[f"denormal_{kind}"]) <= 1 for row in rows
               for kind in ("outputs", "saved", "output_gradients", "weight_gradients"))
    assert all(0 < float(row["min_s"]) <= float(row["median_s"]) <= float(row["max_s"]) for row in rows)
    assert result.stdout.count("x\n") == 2  # a ratio per init
    (tmp_path / "experiments").mkdir()
    shutil.copytree(ROOT / "experiments" / "denormals", tmp_path / "experiments" / "denormals",
                    ignore=shutil.ignore_patterns("cpu"))
    shutil.copy(ROOT / "experiments" / "result_jobs.sh", tmp_path / "experiments")
    logged = tmp_path / "experiments" / "retrieval" / "four_rates" / "0" / "csv" / "version_0"
    logged.mkdir(parents=True)  # a committed job, whose run (and trained model) is on another machine
    (logged / "hparams.yaml").write_text(f"callbacks:\n  final_model:\n    dirpath: {tmp_path / 'elsewhere' / 'model'}\n")
    refused = subprocess.run(["bash", str(tmp_path / "experiments" / "denormals" / "run.sh")], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1
    assert refused.stderr.startswith("denormals/run.sh: no trained model of ") and not (tmp_path / "experiments" / "denormals" / "cpu").exists()


def test_variants_of_one_architecture_differ_in_colour_in_both_figures(tmp_path: Path, monkeypatch) -> None:
    """A study of MCSD's switches beside the Transformer: the accuracy and the rates figures draw
    each curve in a colour of its own, the default variant and the Transformer in their
    architectures' colours, and the same curve in the same colour in both figures."""
    import matplotlib.colors
    import pandas as pd

    import mcsd.plots.tasks as tasks
    from mcsd.plots.style import ARCHITECTURE_COLORS

    drawn = {}

    def record(figure, output_dir, name):
        drawn[name] = {line.get_label(): matplotlib.colors.to_hex(line.get_color())
                       for ax in figure.axes for line in ax.get_lines() if not line.get_label().startswith("_")}
        return []

    monkeypatch.setattr(tasks, "save_figure", record)
    curves = ["mcsd|full", "mcsd|short_conv", "mcsd|input_decay", "transformer|default"]
    rows = pd.DataFrame([{"run": f"{curve}{lr}{length}", "arch": split_curve(curve)[0], "variant": split_curve(curve)[1],
                          "task": "needle", "seed": 0, "lr": lr, "trained_length": 64, "params": 1, "tokens": 1e6,
                          "state_bytes": 1024, "length": length, "accuracy": 0.5, "curve": curve}
                         for curve in curves for lr in (1e-4, 1e-3) for length in (64, 128)])
    tasks.plot_tasks(rows, tmp_path, "retrieval")
    labels = ["MCSD full", "MCSD short_conv", "MCSD input_decay", "Transformer"]
    assert drawn["retrieval"] == drawn["retrieval_rates"] and sorted(drawn["retrieval"]) == sorted(labels)
    assert len(set(drawn["retrieval"].values())) == len(labels)
    assert drawn["retrieval"]["MCSD full"] == matplotlib.colors.to_hex(ARCHITECTURE_COLORS["mcsd"])
    assert drawn["retrieval"]["Transformer"] == matplotlib.colors.to_hex(ARCHITECTURE_COLORS["transformer"])
