"""The MQAR generator against its definition, its accuracy, ``data=mqar`` training (loss
and accuracy on the labelled positions only), ``experiment=mqar_recall`` and its figure."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import lightning as L
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from lightning.pytorch.callbacks import EarlyStopping

from helpers import ROOT
from helpers.runs import FAST, compose_train, read_metrics, run_here, series
from hydra_plugins.mcsd_arms_sweeper import registry_arms
from hydra.errors import HydraException
import mcsd
from mcsd.models.config import ConfigError
from mcsd.bench.decoding import inference_point
from mcsd.data import MQARDataModule
from mcsd.data.corpus import DataError
from mcsd.data.mqar import IGNORE_INDEX, mqar_accuracy, mqar_examples
from mcsd.models import registry
from mcsd.plots.mqar import (best_learning_rate, load_mqar_runs, markdown_mqar_table, plot_accuracy_vs_rate, plot_mqar,
                             run_course, state_frontier)
from mcsd.checkpoint.saved_model import load as load_model
from mcsd.training.run import train
from mcsd.training.callbacks import PlateauStopping

VOCAB, T, K = 64, 48, 6


def test_examples_follow_the_definition() -> None:
    inputs, labels = mqar_examples(200, T, K, VOCAB, seed=3)
    assert inputs.shape == labels.shape == (200, T) and inputs.dtype == labels.dtype == torch.int64
    assert 0 <= inputs.min() and inputs.max() < VOCAB
    for example, label in zip(inputs.tolist(), labels.tolist()):
        keys, values = example[0 : 2 * K : 2], example[1 : 2 * K : 2]
        assert len(set(keys)) == K and all(1 <= key < VOCAB // 2 for key in keys)
        assert len(set(values)) == K and all(VOCAB // 2 <= value < VOCAB for value in values)
        pairs = dict(zip(keys, values))
        scored = [position for position, value in enumerate(label) if value != IGNORE_INDEX]
        # One label per key, in the query region, at an even offset, on that key, equal to its value.
        assert len(scored) == K and all(position >= 2 * K and (position - 2 * K) % 2 == 0 for position in scored)
        assert sorted(example[position] for position in scored) == sorted(keys)
        assert all(label[position] == pairs[example[position]] for position in scored)


def test_examples_are_a_function_of_the_seed() -> None:
    first, again, other = (mqar_examples(8, T, K, VOCAB, seed=seed) for seed in (0, 0, 1))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])


@pytest.mark.parametrize("power_a", [0.01, 1.0])
def test_gaps_follow_the_power_law(power_a: float) -> None:
    """p(g) ~ (g + 1)^(a - 1): with a = 0.01 the first slot is taken far more often than the
    last; with a = 1 the gaps are uniform."""
    _, labels = mqar_examples(4000, 128, 4, 512, seed=0, power_a=power_a)
    gaps = ((labels != IGNORE_INDEX).nonzero()[:, 1] - 8) // 2
    counts = torch.bincount(gaps, minlength=(128 - 8) // 2).float()
    if power_a == 1.0:
        assert counts.min() > 0.6 * counts.mean() and counts.max() < 1.4 * counts.mean()
    else:
        assert counts[0] > 20 * counts[-1].clamp(min=1)


def test_accuracy_is_one_for_an_oracle_and_chance_for_a_constant_model() -> None:
    inputs, labels = mqar_examples(500, T, K, VOCAB, seed=0)
    oracle = torch.nn.functional.one_hot(labels.clamp(min=0), VOCAB).float()
    assert torch.equal(mqar_accuracy(oracle, labels), torch.ones(500))
    constant = torch.zeros(500, T, VOCAB)
    constant[..., VOCAB // 2] = 1.0  # always the first value token
    accuracy = mqar_accuracy(constant, labels).mean().item()
    chance = 1 / (VOCAB - VOCAB // 2)
    assert abs(accuracy - chance) < 0.01


@pytest.mark.parametrize(("seq_len", "num_pairs", "vocab_size", "field"),
                         [(20, 6, 64, "num_pairs"), (48, 0, 64, "num_pairs"), (48, 6, 8, "vocab_size")])
def test_impossible_settings_fail_in_one_line_naming_the_field(seq_len: int, num_pairs: int, vocab_size: int,
                                                              field: str) -> None:
    with pytest.raises(DataError, match=f"data.{field}="):
        mqar_examples(4, seq_len, num_pairs, vocab_size, seed=0)


def test_datamodule_splits_are_distinct_and_a_function_of_the_seed() -> None:
    def splits(seed: int) -> dict:
        return MQARDataModule(vocab_size=VOCAB, seq_len=T, num_pairs=K, num_train=64, num_val=16, batch_size=8,
                              seed=seed).build()

    first, again, other = splits(0), splits(0), splits(1)
    assert [len(first[name]) for name in ("train", "val", "test")] == [64, 16, 16]
    assert all(torch.equal(first[name].inputs, again[name].inputs) for name in first)
    assert not torch.equal(first["val"].inputs, first["test"].inputs[:16])
    assert not torch.equal(first["train"].inputs, other["train"].inputs)
    batch = next(iter(first["train"]))
    assert set(batch) == {"input_ids", "labels"} and batch["labels"].shape == (T,)


def test_fresh_examples_are_new_every_pass_and_a_resumed_run_reads_the_same() -> None:
    """data.fresh_examples: the first pass is the fixed training set in the fixed order, every
    later pass new MQAR examples (none of the first pass's), validation unchanged; a loader
    restored mid-pass goes on with the examples the uninterrupted one reads."""
    def module(fresh: bool) -> MQARDataModule:
        data = MQARDataModule(vocab_size=VOCAB, seq_len=T, num_pairs=K, num_train=64, num_val=16, batch_size=16,
                              seed=0, fresh_examples=fresh)
        data.build()
        return data

    def passes(loader, count: int, states: list | None = None) -> list[dict[str, torch.Tensor]]:
        batches = []
        for _ in range(count):
            iterator = iter(loader)
            for _ in range(len(loader)):
                batches.append(next(iterator))
                if states is not None:
                    states.append(loader.state_dict())
        return batches

    fixed, fresh = module(False), module(True)
    assert torch.equal(fresh.splits["val"].inputs, fixed.splits["val"].inputs)
    states: list = []
    fixed_stream, fresh_stream = passes(fixed.train_dataloader(), 3), passes(fresh.train_dataloader(), 3, states)
    rows = [{tuple(row) for batch in stream[k * 4:(k + 1) * 4] for row in batch["input_ids"].tolist()}
            for stream in (fixed_stream, fresh_stream) for k in range(3)]
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(fixed_stream[:4], fresh_stream[:4]))
    assert rows[0] == rows[1] == rows[2] == rows[3] and len(rows[3]) == 64  # the fixed set: one set, reshuffled
    assert not rows[3] & rows[4] and not rows[3] & rows[5] and not rows[4] & rows[5]  # fresh: new every pass
    for batch in fresh_stream[4:]:  # and MQAR examples: each query is answered by its key's value in the prefix
        for inputs, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist()):
            pairs = dict(zip(inputs[0:2 * K:2], inputs[1:2 * K:2]))
            answered = [(inputs[t], label) for t, label in enumerate(labels) if label != IGNORE_INDEX]
            assert len(answered) == K and all(pairs[key] == value for key, value in answered)
    for stop in (2, 4, 6):  # mid-pass 0, at its end, mid-pass 1
        resumed = module(True).train_dataloader()
        resumed.load_state_dict(states[stop - 1])
        restored = iter(resumed)  # the rest of the restored pass (none after its last batch), then one more pass
        rest = [next(restored) for _ in range(4 - stop % 4)] if stop % 4 else []
        rest += passes(resumed, 1)
        assert len(rest) >= 4 and all(torch.equal(a["input_ids"], b["input_ids"])
                                     for a, b in zip(rest, fresh_stream[stop:stop + len(rest)], strict=True))


def test_datamodule_refuses_fewer_examples_than_a_batch() -> None:
    with pytest.raises(DataError, match="data.num_train=4 is fewer than data.batch_size=8"):
        MQARDataModule(num_train=4, batch_size=8)


MQAR_RUN = ["data=mqar", "model.num_layers=2", "data.seq_len=32", "data.num_pairs=4", "data.num_train=256",
            "data.num_val=48", "data.batch_size=16"]


def test_training_scores_the_labelled_positions_and_logs_accuracy(tmp_path: Path) -> None:
    """The logged loss and accuracy of the final model are those of its logits at the labelled
    positions of the validation split, computed here from the saved model."""
    run_dir = tmp_path / "run"
    cfg = compose_train(run_dir, *FAST, *MQAR_RUN, "trainer.limit_val_batches=null", "logger=csv",
                        "test_after_training=false")
    val_loss = train(cfg)
    rows = read_metrics(run_dir)
    logged_accuracy = series(rows, "val/mqar_acc")
    assert sorted(logged_accuracy) == [0, 2, 5]  # before training, at step 3 and at the end
    model = load_model(run_dir / "model").eval()
    val = MQARDataModule(vocab_size=cfg.model.vocab_size, seq_len=32, num_pairs=4, num_train=256, num_val=48,
                         batch_size=16, seed=cfg.seed).build()["val"]
    with torch.no_grad():
        logits = model(val.inputs)
    scored = val.labels != IGNORE_INDEX
    # Mean of per-batch losses (Lightning's epoch mean), each over that batch's labelled positions.
    losses = [F.cross_entropy(logits[start:start + 16][scored[start:start + 16]], val.labels[start:start + 16][scored[start:start + 16]])
              for start in range(0, 48, 16)]
    assert val_loss == pytest.approx(torch.stack(losses).mean().item(), rel=1e-5)
    assert logged_accuracy[5] == pytest.approx(mqar_accuracy(logits, val.labels).mean().item(), abs=1e-6)


@pytest.mark.slow
def test_compile_trains_mqar_as_eager_does(tmp_path: Path) -> None:
    """``compile=true`` compiles MQAR's loss too (the model and the LM head at the labelled
    positions alone, in one graph): the same losses and accuracy as the eager run. Traced without
    inductor: the model's loss through inductor is tests/training/test_train.py's."""
    overrides = [*FAST, *MQAR_RUN, "model.num_layers=1", "trainer.max_steps=2", "trainer.val_check_interval=2",
                 "logger=csv", "validate_before_training=false", "test_after_training=false"]
    train(compose_train(tmp_path / "eager", *overrides))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    train(compose_train(tmp_path / "compiled", *overrides, "compile=true"))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it did compile
    eager, compiled = (read_metrics(tmp_path / name) for name in ("eager", "compiled"))
    assert sorted(series(compiled, "train/loss")) == [0, 1]
    for metric in ("train/loss", "val/loss", "val/mqar_acc"):
        assert series(compiled, metric) == pytest.approx(series(eager, metric), rel=1e-4), metric


def test_registry_arms_name_every_architecture_and_the_variants_asked() -> None:
    arms = registry_arms(["default", "slope_only"])
    defaults = [[f"model={name}", f"variant={next(iter(registry.get(name).variants))}"] for name in registry.architectures()]
    assert [arm for arm in arms if arm != ["model=mcsd", "variant=slope_only"]] == defaults
    assert ["model=mcsd", "variant=slope_only"] in arms and len(arms) == len(registry.architectures()) + 1
    every = registry_arms(["all"])
    assert len(every) == sum(len(registry.get(name).variants) for name in registry.architectures())
    with pytest.raises(HydraException, match="registry_variants names 'slope_onyl'"):
        registry_arms(["slope_onyl"])


def test_registry_architectures_keep_the_arms_of_the_architectures_named() -> None:
    every = registry_arms(["all"])
    for name in registry.architectures():
        assert registry_arms(["all"], [name]) == [arm for arm in every if arm[0] == f"model={name}"]
    assert registry_arms(["default", "slope_only"], ["transformer"]) == [["model=transformer", "variant=default"]]
    with pytest.raises(HydraException, match="registry_architectures names 'retnte', which is not registered"):
        registry_arms(["default"], ["retnte"])
    with pytest.raises(HydraException, match="names no variant of transformer: add default or all"):
        registry_arms(["slope_only"], ["transformer"])


def test_registry_settings_go_into_their_architectures_arms_alone() -> None:
    plain = registry_arms(["default", "slope_only"])
    arms = registry_arms(["default", "slope_only"], None, {"mcsd": ["model.chunk_size=32"]})
    assert arms == [arm + ["model.chunk_size=32"] if arm[0] == "model=mcsd" else arm for arm in plain]
    with pytest.raises(HydraException, match="registry_settings names 'msd', which is not registered"):
        registry_arms(["default"], None, {"msd": ["model.chunk_size=32"]})


@pytest.mark.parametrize("seq_len, num_pairs, batch_size", [(64, 4, 512), (128, 8, 512), (256, 16, 256)])
def test_zoology_protocol_composes_to_zoology_figure2(tmp_path: Path, seq_len: int, num_pairs: int,
                                                     batch_size: int) -> None:
    """experiment=mqar_zoology is zoology's Figure 2 (iclr24_zoology_figure2/configs.py): its data
    sizes, epochs, vocabulary, batch sizes, widths, learning rates and layer counts, no MLP."""
    from hydra import compose, initialize_config_module

    cfg = compose_train(tmp_path / "run", "experiment=mqar_zoology", f"data.seq_len={seq_len}")
    assert (cfg.data.num_train, cfg.data.num_val, cfg.model.vocab_size) == (100_000, 3_000, 8192)
    assert (cfg.data.num_pairs, cfg.data.batch_size) == (num_pairs, batch_size)
    assert (cfg.trainer.max_epochs, cfg.trainer.max_steps) == (64, -1)
    assert cfg.model.mlp_hidden_size == 0 and cfg.model.num_layers == 4
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        sweep = compose("train", overrides=["experiment=mqar_zoology"], return_hydra_config=True).hydra.sweeper
    assert sweep.params["model.hidden_size"] == "64,128,256,512" and sweep.params["data.seq_len"] == "64,128,256"
    rates = [float(rate) for rate in sweep.params["optimizer.lr"].split(",")]
    assert rates == pytest.approx([10 ** (-4 + 2 * index / 3) for index in range(4)], rel=1e-7)
    assert list(sweep.registry_settings["transformer"]) == ["model.num_layers=2", "model.num_channels=1"]
    arm = compose_train(tmp_path / "arm", "experiment=mqar_zoology", "model=transformer", "model.hidden_size=64",
                        *sweep.registry_settings["transformer"])
    transformer = mcsd.build_model(arm.model)
    assert all(layer.mlp is None and layer.mlp_norm is None for layer in transformer.layers)
    expected = 2 * 8192 * 64 + 64 + 2 * (64 + 4 * 64 * 64)  # embedding, head, final norm; norm, qkv, out
    assert sum(p.numel() for p in transformer.parameters()) == expected


def test_converging_protocol_stops_on_a_plateau_and_goes_on_while_accuracy_rises(tmp_path: Path) -> None:
    """experiment=mqar_converge's early stopping on val/mqar_acc: a run that cannot learn (lr 0)
    stops after `patience` epochs without a rise; a run that learns goes on while it rises."""
    small = ["model=transformer", "model.hidden_size=32", "model.vocab_size=64", "data.seq_len=16",
             "data.num_train=512", "data.num_val=64", "data.batch_size=32", "trainer.max_epochs=12",
             "callbacks.early_stopping.patience=2", "callbacks.progress_bar.refresh_rate=0", "logger=csv",
             "test_after_training=false", "scheduler.warmup_steps=2", "trainer.log_every_n_steps=4",
             "trainer.min_epochs=1"]
    epochs = {}
    for name, lr in (("flat", 0.0), ("learning", 3e-3)):
        run_dir = tmp_path / name
        train(compose_train(run_dir, "experiment=mqar_converge", *small, f"optimizer.lr={lr}", "model.num_layers=2",
                            "model.num_channels=1"))
        accuracy = series(read_metrics(run_dir), "val/mqar_acc")
        epochs[name] = [accuracy[step] for step in sorted(accuracy)]
    flat, learning = epochs["flat"], epochs["learning"]
    assert len(flat) == 1 + 3  # before training, then the best epoch and 2 without a rise (plus none more)
    assert max(flat) - min(flat) < 0.001
    assert len(learning) > len(flat) and learning[-1] > learning[0] + 0.1
    rises = [index for index in range(1, len(learning)) if learning[index] > max(learning[:index]) + 0.001]
    assert len(learning) - 1 - rises[-1] <= 2 or len(learning) == 13  # stopped within patience of its last rise
    # mcsd-plot mqar's account of each run: its epochs, examples, best accuracy and why it stopped.
    runs = load_mqar_runs(tmp_path).set_index("run")
    flat_run = runs.loc["flat/csv/version_0"]
    assert (flat_run["epochs"], flat_run["stopped"], flat_run["examples"]) == (3, "plateau", 3 * 512)
    learning_run = runs.loc["learning/csv/version_0"]
    assert learning_run["epochs"] == len(learning) - 1 and learning_run["best_accuracy"] == max(learning[1:])
    assert learning_run["stopped"] == ("plateau" if len(learning) < 13 else "cap")
    logged = pd.read_csv(tmp_path / "learning/csv/version_0/metrics.csv")
    steps = logged.dropna(subset=["train/loss"])
    assert learning_run["train_loss"] == pytest.approx(steps[steps["epoch"] == steps["epoch"].max()]["train/loss"].mean())
    assert learning_run["val_loss"] == pytest.approx(logged["val/loss"].dropna().iloc[-1])
    # The protocol's min_epochs: a run that cannot learn still trains that many epochs.
    train(compose_train(tmp_path / "floor", "experiment=mqar_converge", *small[:-1], "trainer.min_epochs=5",
                        "optimizer.lr=0.0", "model.num_layers=2", "model.num_channels=1"))
    assert len(series(read_metrics(tmp_path / "floor"), "val/mqar_acc")) == 1 + 5


class _ScriptedAccuracy(L.LightningModule):
    """Logs val/mqar_acc from a script, one value per epoch: early stopping's input, nothing else."""

    def __init__(self, script: list[float]) -> None:
        super().__init__()
        self.script = script
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return (self.weight * batch).sum()

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val/mqar_acc", self.script[self.current_epoch])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


@pytest.mark.parametrize("script, epochs", [
    ([0.001] * 6 + [0.004, 0.007, 0.010, 0.020, 0.030, 0.040], 12),  # stalls early, rises before min_epochs: goes on
    ([0.001] * 12, 8),  # never rises: stopped at min_epochs
    ([0.001, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.06, 0.06, 0.06, 0.06, 0.06], 11),  # stalls after epoch 7: 4 later
])
def test_plateau_stopping_decides_from_min_epochs_on(tmp_path: Path, script: list[float], epochs: int) -> None:
    """experiment=mqar_converge's stopping rule: no rise of min_delta for `patience` epochs, judged
    at min_epochs or later. Lightning's EarlyStopping alone stops the first script at epoch 8,
    because its stop request, made during the early stall, outlives the rise."""
    loader = torch.utils.data.DataLoader(torch.ones(2, 1), batch_size=1)
    stopping = PlateauStopping(monitor="val/mqar_acc", mode="max", patience=4, min_delta=0.001)
    trainer = L.Trainer(max_epochs=12, min_epochs=8, callbacks=[stopping], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(_ScriptedAccuracy(script), loader, loader)
    assert trainer.current_epoch == epochs

    def verdict(target: str, played: int) -> str:  # mcsd-plot mqar's account of the run: why it stopped
        config = {"callbacks": {"early_stopping": {"_target_": target, "patience": 4, "min_delta": 0.001},
                                "epoch_cap": {"epochs": 12}}, "trainer": {"min_epochs": 8}, "data": {"seq_len": 16}}
        metrics = pd.DataFrame({"step": range(1, played + 1), "val/mqar_acc": script[:played]})
        return run_course(config, metrics)["stopped"]

    assert verdict("mcsd.training.callbacks.PlateauStopping", epochs) == ("cap" if epochs == 12 else "plateau")
    if epochs == 12 and min(script[6:]) > script[0]:  # the stock callback, for contrast: stopped at min_epochs
        stock = L.Trainer(max_epochs=12, min_epochs=8, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, default_root_dir=tmp_path, callbacks=[EarlyStopping(
                              monitor="val/mqar_acc", mode="max", patience=4, min_delta=0.001)])
        stock.fit(_ScriptedAccuracy(script), loader, loader)
        assert stock.current_epoch == 8
        assert verdict("lightning.pytorch.callbacks.EarlyStopping", 8) == "plateau"


def test_the_epoch_cap_stops_a_run_that_is_the_uncapped_one_until_then(tmp_path: Path) -> None:
    """experiment=mqar_converge's epoch cap (callbacks.epoch_cap) stops after its epochs, with the
    learning-rate schedule still laid out over max_epochs: every step before the cap (its
    learning rate, loss and validations) is the uncapped run's."""
    small = ["model=transformer", "model.hidden_size=32", "model.vocab_size=64", "data.seq_len=16", "model.num_layers=2",
             "model.num_channels=1", "data.num_train=256", "data.num_val=32", "data.batch_size=32",
             "trainer.max_epochs=4", "callbacks.early_stopping.patience=10", "callbacks.progress_bar.refresh_rate=0",
             "logger=csv", "test_after_training=false", "scheduler.warmup_steps=2", "trainer.log_every_n_steps=2",
             "optimizer.lr=3e-3", "trainer.min_epochs=1"]
    logs = {}
    for epochs in (2, 4):
        run_dir = tmp_path / f"cap{epochs}"
        train(compose_train(run_dir, "experiment=mqar_converge", *small, f"callbacks.epoch_cap.epochs={epochs}"))
        logs[epochs] = read_metrics(run_dir)
    capped, uncapped = logs[2], logs[4]
    runs = load_mqar_runs(tmp_path).set_index("run")
    assert runs.loc["cap2/csv/version_0", "stopped"] == "cap" and runs.loc["cap2/csv/version_0", "epochs"] == 2
    with pytest.raises(ConfigError, match="callbacks.epoch_cap.epochs=2 is below trainer.min_epochs=3"):
        train(compose_train(tmp_path / "contradiction", "experiment=mqar_converge", *small[:-1], "trainer.min_epochs=3",
                            "callbacks.epoch_cap.epochs=2"))
    assert len(series(capped, "val/mqar_acc")) == 1 + 2 and len(series(uncapped, "val/mqar_acc")) == 1 + 4
    for name in ("lr-AdamW/pg1", "train/loss", "val/mqar_acc"):
        kept = series(capped, name)
        assert kept and kept == {step: value for step, value in series(uncapped, name).items() if step in kept}
    capped_rates, rates = series(capped, "lr-AdamW/pg1"), series(uncapped, "lr-AdamW/pg1")
    assert max(capped_rates) < max(rates)  # it stopped at half the steps,
    assert capped_rates[max(capped_rates)] > 2 * rates[max(rates)]  # its learning rate mid-schedule, not at the floor


@pytest.fixture(scope="module")
def recall_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mcsd-train -m experiment=mqar_recall`` at a tiny budget: every arm, 2 widths, 2 learning
    rates (the folder it ran in)."""
    folder = tmp_path_factory.mktemp("recall")
    result = run_here("mcsd-train", "-m", "experiment=mqar_recall", "model.hidden_size=16,32", "data.seq_len=32",
                     "optimizer.lr=1e-3,3e-3", "data.num_train=128", "data.num_val=32", "data.batch_size=16",
                     "trainer.max_steps=2", "scheduler.warmup_steps=1", "logger=csv", "test_after_training=false",
                     "callbacks.progress_bar.refresh_rate=0", cwd=folder)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


@pytest.mark.slow
def test_sweep_script_adds_an_architecture_beside_the_committed_jobs(recall_sweep: Path, tmp_path: Path) -> None:
    """experiments/sweep.sh --add keeps the jobs already in the results folder (here one job of
    the recall sweep, as --replace would have copied it) and numbers the new sweep's jobs after
    them, each job's result.json beside its csv/; the figure (the real mcsd-plot) then draws both. A stand-in mcsd-train records its
    arguments and writes one job of the recall sweep (the Transformer's) where the sweep's would be:
    the script's folders and numbering are under test here, the sweep itself in recall_sweep."""
    script = tmp_path / "experiments" / "sweep.sh"
    script.parent.mkdir()
    for name in ("sweep.sh", "corpus_path.sh"):
        shutil.copy(ROOT / "experiments" / name, script.parent / name)
    results = tmp_path / "experiments" / "mqar_recall" / "cpu"
    runs = load_mqar_runs(recall_sweep / "logs").sort_values("run")
    committed = runs.iloc[0]
    assert committed["curve"] == "mcsd|full"
    shutil.copytree(recall_sweep / "logs" / committed["run"], results / "0" / "csv" / "version_0")
    added = recall_sweep / "logs" / runs.loc[runs["curve"] == "transformer|default", "run"].iloc[0]
    stand_in, calls = tmp_path / "bin" / "mcsd-train", tmp_path / "calls.txt"
    stand_in.parent.mkdir()
    stand_in.write_text(f"""#!/bin/sh
echo "$*" > {calls}
for argument; do case "$argument" in hydra.sweep.dir=*) sweep="${{argument#hydra.sweep.dir=}}";; esac; done
mkdir -p "$sweep/0/csv/version_0" && cp {added}/metrics.csv {added}/hparams.yaml "$sweep/0/csv/version_0/"
echo '{{"status": "diverged", "diverged_at_step": 1}}' > "$sweep/0/result.json"
""")
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{stand_in.parent}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "WANDB_MODE": "offline"}
    result = subprocess.run(["bash", str(script), "mqar_recall", "--add", "--name", "cpu", "own", "model.hidden_size=16",
                             "hydra.sweeper.registry_architectures=[transformer]"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert calls.read_text().startswith(
        "-m experiment=mqar_recall hydra/launcher=local_parallel "
        f"paths.log_dir={script.parent}/mqar_recall/logs/cpu hydra.sweep.dir={script.parent}/mqar_recall/logs/cpu/train/")
    assert calls.read_text().rstrip().endswith(" model.hidden_size=16 hydra.sweeper.registry_architectures=[transformer]")
    assert sorted(path.name for path in results.iterdir() if path.is_dir()) == ["0", "1"]
    runs = load_mqar_runs(results).sort_values("run")
    assert list(runs["curve"]) == ["mcsd|full", "transformer|default"]
    assert list(runs["stopped"]) == ["budget", "diverged"]  # how the job ended, copied beside its csv/
    assert (results / "mqar_recall_table.md").is_file()


@pytest.mark.slow
def test_recall_experiment_sweeps_the_registry_and_plots_accuracy_vs_width(recall_sweep: Path) -> None:
    tmp_path = recall_sweep
    runs = load_mqar_runs(tmp_path / "logs")
    assert len(runs) == 4 * (len(registry.architectures()) + 1)
    # The hybrid's 2 layers hold an attention layer (the experiment's registry_settings).
    assert set(runs.loc[runs["curve"].str.startswith("wonderful_matrices|"), "curve"]) == {
        "wonderful_matrices|default, attention_every=2"}
    assert set(runs["num_pairs"]) == {2} and set(runs["width"]) == {16, 32}  # K = T / 16
    figure = plot_mqar(runs, tmp_path / "figure")
    assert [path.name for path in figure.paths] == ["mqar_recall.png", "mqar_recall.pdf", "mqar_recall_state.png",
                                                    "mqar_recall_state.pdf", "mqar_recall_rates.png",
                                                    "mqar_recall_rates.pdf", "mqar_recall_table.md", "mqar_recall_runs.md"]
    assert set(runs["stopped"]) == {"budget"} and set(runs["examples"]) == {2 * 16}  # 2 steps of 16 examples
    # The state axis is mcsd-bench's state_bytes_per_sequence after the T tokens of an example.
    for run in runs.drop_duplicates(["curve", "width"]).itertuples():
        config = yaml.safe_load((tmp_path / "logs" / run.run / "hparams.yaml").read_text())
        measured = inference_point(config["model"], batch_size=1, prompt_len=16, gen_len=16, repeats=1, warmup=0,
                                   device="cpu", dtype="float32", seed=0)
        assert run.state_bytes == measured["state_bytes_per_sequence"] > 0
    attention = runs[runs["curve"] == "transformer|default"].drop_duplicates("width").set_index("width")["state_bytes"]
    assert attention[16] == 2 * 2 * 32 * 16 * 4  # 2 layers, keys and values, T positions, fp32
    assert (figure.table.groupby(["curve", "width"]).size() == 1).all()  # one point per curve and width
    assert figure.labels[:2] == ["MCSD full", "MCSD slope_only"] and len(figure.labels) == len(runs) // 4
    # Each point is the best of its two learning rates.
    best = runs.groupby(["curve", "width"])["accuracy"].max().reset_index()
    merged = figure.table.merge(best, on=["curve", "width"], suffixes=("", "_best"))
    assert len(merged) == len(figure.table) == 2 * len(figure.labels)
    assert (merged["accuracy"] == merged["accuracy_best"]).all() and (figure.table["lrs_tried"] == 2).all()
    table = figure.paths[-2].read_text()
    assert table.count("\n") == 2 + len(figure.table) + 2 and "| T=32, K=2 |" in table
    # Of two rates the best is always one of the grid's ends: each is starred, the note says why.
    assert figure.table["at_edge"].all() and table.count("*)") == len(figure.table)
    assert "the grid does not bracket it" in table.splitlines()[-1]
    assert figure.paths[-1].read_text().count("\n") == 2 + len(runs)  # a line per run


def test_the_state_frontier_keeps_the_points_no_smaller_state_beats() -> None:
    """Zoology's recall / state-size frontier: a point is on it when every point with at most its
    bytes recalls less; ties in bytes keep the better point, ties in accuracy the smaller state."""
    points = pd.DataFrame({"state_bytes": [100, 100, 200, 400, 400, 800, 1600],
                           "accuracy": [0.2, 0.5, 0.4, 0.5, 0.9, 0.9, 1.0]})
    frontier = state_frontier(points)
    assert list(zip(frontier["state_bytes"], frontier["accuracy"])) == [(100, 0.5), (400, 0.9), (1600, 1.0)]


def test_a_best_rate_inside_the_grid_is_not_starred_and_each_point_gets_its_rate_panel(tmp_path: Path) -> None:
    """best_learning_rate marks a best at the lowest or highest rate tried (not bracketed) and no
    other; the rates figure has a panel per (T, K) and width."""
    rows = [{"curve": "mcsd|full", "seq_len": 64, "num_pairs": 4, "width": width, "lr": lr, "accuracy": accuracy,
             "state_bytes": 1, "seed": 0}
            for width, accuracies in ((64, (0.1, 0.5, 0.2)), (128, (0.1, 0.2, 0.3)))
            for lr, accuracy in zip((1e-4, 1e-3, 1e-2), accuracies)]
    runs = pd.DataFrame(rows)
    best = best_learning_rate(runs).set_index("width")
    assert best.loc[64, "lr"] == 1e-3 and not best.loc[64, "at_edge"]
    assert best.loc[128, "lr"] == 1e-2 and best.loc[128, "at_edge"]
    table = markdown_mqar_table(best.reset_index())
    assert "| MCSD full | 64 | 0.500 (lr 0.001) |" in table and "| MCSD full | 128 | 0.300 (lr 0.01*) |" in table
    paths = plot_accuracy_vs_rate(runs, best.reset_index(), tmp_path, "rates")
    assert [path.name for path in paths] == ["rates.png", "rates.pdf"] and all(path.stat().st_size for path in paths)


def test_a_run_that_diverged_has_no_final_accuracy_and_its_rate_loses(tmp_path: Path) -> None:
    """A run validated to 0.9 then diverged (its result.json, kept by sweep.sh beside csv/, says
    so): its last validation is not its final accuracy; the rate that trained is the best, the
    diverged one reads ``-`` in the runs table and is a cross in the rates figure."""
    from helpers.models import tiny_config
    from mcsd.checkpoint.run_folder import write_result
    from mcsd.plots.mqar import markdown_mqar_runs

    for job, (lr, accuracies, status) in enumerate([(1e-3, (0.1, 0.5), "finished"), (1e-2, (0.2, 0.9), "diverged")]):
        logs = tmp_path / "runs" / str(job) / "csv" / "version_0"
        logs.mkdir(parents=True)
        (logs / "hparams.yaml").write_text(yaml.safe_dump({
            "model": tiny_config("mcsd"), "optimizer": {"lr": lr}, "seed": 0,
            "data": {"seq_len": 16, "num_pairs": 2}}))
        pd.DataFrame({"step": [0, 5, 10], "epoch": [0, 0, 1], "trainer/tokens": [0.0, 80.0, 160.0],
                      "train/loss": [None, 2.0, 1.5], "val/loss": [3.0, 2.5, 2.0],
                      "val/mqar_acc": [0.0, *accuracies]}).to_csv(logs / "metrics.csv", index=False)
        write_result(tmp_path / "runs" / str(job), {"status": status})
    runs = load_mqar_runs(tmp_path / "runs").set_index("lr")
    assert runs.loc[1e-3, "accuracy"] == 0.5 and pd.isna(runs.loc[1e-2, "accuracy"])
    assert (runs.loc[1e-3, "stopped"], runs.loc[1e-2, "stopped"], runs.loc[1e-2, "best_accuracy"]) == ("budget", "diverged", 0.9)
    best = best_learning_rate(runs.reset_index())
    assert (best["lr"].tolist(), best["accuracy"].tolist(), best["lrs_tried"].tolist()) == ([1e-3], [0.5], [2])
    assert "| 0.01 | 2 | 10 | 160 | 1.50 | 2.00 | - | 0.900 | - | diverged |" in markdown_mqar_runs(runs.reset_index())
    assert plot_accuracy_vs_rate(runs.reset_index(), best, tmp_path, "rates")[0].stat().st_size > 0
    diverged_only = best_learning_rate(runs.reset_index().query("lr == 1e-2"))
    assert "| diverged (lr 0.01) |" in markdown_mqar_table(diverged_only)
