"""mcsd-train end to end: a short run learns, logs, checkpoints, resumes and saves its model."""

from __future__ import annotations

import functools
import gc
import json
import math
import random
import shutil
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

import mcsd
from helpers.models import relative_rms_error, tiny_config, tiny_model_to_compile
from tokenizers import Tokenizer

from helpers.runs import FAST, compose_train, read_metrics, run_here, series, train_refusal
from mcsd.data.tokenizer import train_tokenizer
from mcsd.models import registry
from mcsd.training.run import train

FAST_BY_BUDGET = [setting for setting in FAST if not setting.startswith("trainer.max_steps=")]  # data.token_budget sets it


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """One short run of the tiny MCSD (W&B offline + CSV), shared by the tests below."""
    run_dir = tmp_path_factory.mktemp("run") / "out"
    overrides = [*FAST, "trainer.max_steps=40", "trainer.val_check_interval=20", "optimizer.lr=3e-3"]
    val_loss = train(compose_train(run_dir, *overrides))
    return run_dir, val_loss


@pytest.mark.slow
def test_short_run_learns(trained_run: tuple[Path, float]) -> None:
    run_dir, val_loss = trained_run
    rows = read_metrics(run_dir)
    val_ppl = series(rows, "val/ppl")
    assert sorted(val_ppl) == [0, 19, 39]  # the untrained model at 0 tokens, then every 20 steps
    assert val_ppl[0] > 300  # ~ the 512-token vocabulary: untrained
    assert val_ppl[39] < 0.5 * val_ppl[0]
    assert val_loss == pytest.approx(series(rows, "val/loss")[39])
    assert math.exp(val_loss) == pytest.approx(val_ppl[39], rel=0.05)


@pytest.mark.slow
def test_train_ppl_is_the_exp_of_the_loss_it_is_logged_with(trained_run: tuple[Path, float]) -> None:
    rows = read_metrics(trained_run[0])
    losses, ppls = series(rows, "train/loss"), series(rows, "train/ppl")
    assert ppls and set(ppls) == set(losses)
    assert all(ppls[step] == pytest.approx(math.exp(losses[step]), rel=1e-5) for step in ppls)


@torch.no_grad()
def test_perplexity_from_the_loss_equals_torchmetrics_perplexity_of_the_logits() -> None:
    """What training logs (``exp`` of the step's loss) and evaluation accumulates (:class:`LossPerplexity`:
    losses weighted by their scored tokens) equal torchmetrics' ``Perplexity`` of the logits, which
    was logged before (it took a softmax over [tokens, vocabulary] and a host sync every step):
    next-token batches of different lengths, and MQAR's batches scored at their labels only."""
    from torchmetrics.text import Perplexity

    from mcsd.data.mqar import IGNORE_INDEX
    from mcsd.training.module import LanguageModelModule, LossPerplexity

    module = LanguageModelModule(model=tiny_config("mcsd"), optimizer=torch.optim.AdamW)
    for labelled in (False, True):
        ours, theirs = LossPerplexity(), Perplexity()
        for length in (9, 17, 33):
            batch = {"input_ids": torch.randint(0, 101, (3, length))}
            if labelled:
                batch["labels"] = torch.where(torch.rand(3, length) < 0.3, torch.randint(0, 101, (3, length)), IGNORE_INDEX)
            loss, logits, targets = module._loss(batch)
            step = Perplexity()(logits.float(), targets)
            assert loss.exp().item() == pytest.approx(step.item(), rel=1e-5)
            ours.update(loss, targets.numel())
            theirs.update(logits.float(), targets)
        assert ours.compute().item() == pytest.approx(theirs.compute().item(), rel=1e-5)


@pytest.mark.slow
def test_every_curve_has_tokens_seen(trained_run: tuple[Path, float]) -> None:
    rows = read_metrics(trained_run[0])
    tokens = series(rows, "trainer/tokens")
    for row in rows:
        if row.get("train/loss") or row.get("val/loss"):
            assert row["trainer/tokens"]
    assert tokens[39] == 40 * 8 * 64  # steps * batch * seq_len
    assert series(rows, "train/device/items_per_sec")  # throughput in tokens/s
    # The monitor's FLOPs are the model FLOPs (CausalLM.training_flops) of each step's 8 x 64 tokens.
    flops, items = series(rows, "train/device/flops_per_sec"), series(rows, "train/device/items_per_sec")
    assert flops and set(flops) == set(items)
    per_token = mcsd.load(trained_run[0]).training_flops(8, 64) / (8 * 64)
    assert all(flops[step] / items[step] == pytest.approx(per_token) for step in flops)
    assert series(rows, "lr-AdamW/pg1")


@pytest.mark.slow
def test_run_leaves_checkpoints_wandb_run_and_model(trained_run: tuple[Path, float]) -> None:
    run_dir, _ = trained_run
    hparams = yaml.safe_load((run_dir / "csv" / "version_0" / "hparams.yaml").read_text())
    assert (hparams["model/arch"], hparams["model/variant"], hparams["model/mlp_hidden_size"]) == ("mcsd", "full", 192)
    assert {p.name for p in (run_dir / "checkpoints").iterdir()} >= {"last.ckpt", "step-000039.ckpt"}
    wandb_runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 1
    model = mcsd.load(run_dir)
    assert isinstance(model, mcsd.CausalLM) and model.config.hidden_size == 64
    tokenizer = mcsd.load_tokenizer(run_dir)
    ids = tokenizer.encode("The for statement").ids
    assert tokenizer.decode(ids) == "The for statement"


@pytest.mark.slow
def test_generate_streams_a_continuation(trained_run: tuple[Path, float], tmp_path: Path) -> None:
    run_dir, _ = trained_run
    result = run_here("mcsd-generate", f"ckpt={run_dir}", "prompt=The for", "max_new_tokens=12", "temperature=0",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    model, tokenizer = mcsd.load(run_dir), mcsd.load_tokenizer(run_dir)
    prompt = torch.tensor([tokenizer.encode("The for").ids])
    generated = model.generate(prompt, 12)[0, prompt.shape[1]:].tolist()
    eos = tokenizer.token_to_id("<|endoftext|>")
    expected = tokenizer.decode(generated[: generated.index(eos)] if eos in generated else generated)
    assert result.stdout == "The for" + expected + "\n"
    assert not list(tmp_path.iterdir())  # generating writes nothing
    assert "warning" not in result.stderr
    # Past the 64 tokens of the run's data.seq_len: a warning, from the model folder and from a checkpoint alike.
    training = json.loads((run_dir / "model" / "training.json").read_text())
    assert training == {"seq_len": 64, "wandb_run": training["wandb_run"]} and len(training["wandb_run"]) == 8
    for ckpt in (run_dir, run_dir / "checkpoints" / "last.ckpt"):
        long_prompt = " ".join(["The for statement"] * 25)
        result = run_here("mcsd-generate", f"ckpt={ckpt}", f"prompt={long_prompt}", "max_new_tokens=4",
                          "temperature=0", cwd=tmp_path)
        prompt_tokens = len(tokenizer.encode(long_prompt).ids)
        assert prompt_tokens + 4 > 64
        assert result.returncode == 0 and (
            f"mcsd-generate: warning: the prompt ({prompt_tokens} tokens) and max_new_tokens=4 reach past the 64 tokens "
            "a sequence had in training (data.seq_len)") in result.stderr, result.stderr


@pytest.mark.slow
def test_any_checkpoint_of_a_run_is_a_saved_model(trained_run: tuple[Path, float], tmp_path: Path) -> None:
    """A step checkpoint loads, carries its tokenizer and generates; last.ckpt loads as the step
    checkpoint it repeats (step 39 of 40); a run directory without its model folder (a run that
    stopped early) loads from its last checkpoint."""
    run_dir, _ = trained_run
    step = run_dir / "checkpoints" / "step-000021.ckpt"
    ids = torch.randint(0, 512, (2, 30))
    last, latest, early = (mcsd.load(run_dir / "checkpoints" / name) for name in
                           ("last.ckpt", "step-000039.ckpt", "step-000021.ckpt"))
    with torch.no_grad():
        assert torch.equal(last(ids), latest(ids)) and not torch.equal(early(ids), latest(ids))
    assert mcsd.load_tokenizer(step).to_str() == mcsd.load_tokenizer(run_dir).to_str()
    result = run_here("mcsd-generate", f"ckpt={step}", "prompt=The for", "max_new_tokens=5", "temperature=0",
                     "compile=true", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("The for"), result.stderr[-2000:]
    tokenizer = mcsd.load_tokenizer(step)
    prompt = torch.tensor([tokenizer.encode("The for").ids])
    greedy = early.generate(prompt, 5)[0, prompt.shape[1]:].tolist()  # the eager step's tokens
    eos = tokenizer.token_to_id("<|endoftext|>")
    assert result.stdout == "The for" + tokenizer.decode(greedy[: greedy.index(eos)] if eos in greedy else greedy) + "\n"
    stopped = tmp_path / "stopped"
    shutil.copytree(run_dir / "checkpoints", stopped / "checkpoints")
    assert mcsd.locate(stopped) == mcsd.locate(stopped / "checkpoints" / "last.ckpt")
    assert mcsd.locate(stopped).name == "stopped/last"
    with torch.no_grad():
        assert torch.equal(mcsd.load(stopped)(ids), latest(ids))


@pytest.mark.slow
def test_a_run_that_starts_from_weights_tokenizes_with_their_tokenizer(trained_run: tuple[Path, float],
                                                                       tmp_path: Path) -> None:
    """Fine-tuning (init_from) or resuming (ckpt_path) on a new text keeps the tokenizer the
    weights were trained under (a new corpus trained a new BPE under the old embeddings before);
    a data.tokenizer_path that names another tokenizer is refused in one line."""
    source, _ = trained_run
    corpus = tmp_path / "mine.txt"
    corpus.write_text("\n".join(f"line {index}: zebra quokka axolotl {index * 7}" for index in range(400)))
    own = Tokenizer.from_file(str(source / "model" / "tokenizer.json")).to_str()
    new_text = ["data=text_files", f"data.paths=[{corpus}]", "data.sample_by=line", "test_after_training=false",
                "logger=csv"]
    for key, value, steps in [("init_from", source, 2), ("ckpt_path", source / "checkpoints" / "last.ckpt", 42)]:
        run = tmp_path / key
        train(compose_train(run, *FAST, *new_text, f"{key}={value}", f"trainer.max_steps={steps}"))
        assert Tokenizer.from_file(str(run / "model" / "tokenizer.json")).to_str() == own, key
        assert yaml.safe_load((run / "csv" / "version_0" / "hparams.yaml").read_text())["data/tokenizer"] == "the weights'"
    other = tmp_path / "other.json"
    train_tokenizer([corpus.read_text()], 300).save(str(other))
    assert f"data.tokenizer_path={other} is not the tokenizer of init_from={source}" in train_refusal(
        tmp_path / "refused", *FAST, *new_text, f"init_from={source}", f"data.tokenizer_path={other}")
    assert "data.tokenizer_path=mytok.json does not exist (looked for " in train_refusal(
        tmp_path / "missing", *FAST, "data.tokenizer_path=mytok.json")


def test_resume_is_exact_from_any_stop_point(tmp_path: Path) -> None:
    """A 20-step run (data.token_budget) over a corpus of about 6 steps per epoch, and runs
    resumed from its checkpoints mid-epoch, on an epoch's last batch and two epochs later:
    every remaining step logs the loss and tokens of the uninterrupted run, in the same W&B run."""
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    corpus = tmp_path / "small.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(300)))
    common = [*FAST_BY_BUDGET, "data=text_files", f"data.paths=[{corpus}]", "data.sample_by=line", "data.token_budget=10240",
              "callbacks.model_checkpoint.every_n_train_steps=1", "trainer.val_check_interval=100",
              "test_after_training=false"]
    whole = tmp_path / "whole"
    train(compose_train(whole, *common))
    rows = read_metrics(whole)
    whole_loss, whole_tokens = series(rows, "train/loss"), series(rows, "trainer/tokens")
    epochs = {int(row["step"]): int(row["epoch"]) for row in rows if row.get("train/loss")}
    assert sorted(whole_loss) == list(range(20)) and max(epochs.values()) >= 3
    epoch_end = max(step for step, epoch in epochs.items() if epoch == 0) + 1  # steps done when epoch 0 ends
    for stop in (2, epoch_end, 2 * epoch_end + 2):
        resumed = tmp_path / f"resumed-{stop}"
        checkpoint = whole / "checkpoints" / f"step-{stop:06d}.ckpt"
        train(compose_train(resumed, *common, f"ckpt_path={checkpoint}"))
        rows = read_metrics(resumed)
        loss, tokens = series(rows, "train/loss"), series(rows, "trainer/tokens")
        assert sorted(loss) == list(range(stop, 20)), stop
        assert loss == {step: whole_loss[step] for step in range(stop, 20)}, stop
        assert all(tokens[step] == whole_tokens[step] for step in loss), stop
    run_ids = {path.name.rsplit("-", 1)[1] for path in tmp_path.glob("*/wandb/offline-run-*")}
    assert len(run_ids) == 1


@pytest.mark.parametrize("logger", ["csv", "none"])
def test_other_loggers(tmp_path: Path, logger: str) -> None:
    train(compose_train(tmp_path, *FAST, "trainer.max_steps=2", f"logger={logger}"))
    assert (tmp_path / "csv").exists() == (logger == "csv")
    assert not (tmp_path / "wandb").exists()
    assert (tmp_path / "model" / "model.safetensors").is_file()


def test_token_budget_sets_the_steps(tmp_path: Path) -> None:
    train(compose_train(tmp_path, *FAST_BY_BUDGET, "data.token_budget=1500", "logger=csv"))  # 1500 / (8 * 64) -> 3 steps
    assert max(series(read_metrics(tmp_path), "train/loss")) == 2
    assert series(read_metrics(tmp_path), "trainer/tokens")[2] == 3 * 8 * 64


def test_steps_typed_on_the_command_line_win_over_an_experiments_budget(tmp_path: Path) -> None:
    """experiment=fig9_ablation sets a 1,000,000-token budget (1,953 steps of these blocks): a
    trainer.max_steps the user typed is the run's length; typing a budget too is refused."""
    train(compose_train(tmp_path / "typed", *FAST_BY_BUDGET, "experiment=fig9_ablation", "trainer.max_steps=4",
                        "logger=csv", "test_after_training=false"))
    assert max(series(read_metrics(tmp_path / "typed"), "train/loss")) == 3
    assert ("trainer.max_steps=6 and data.token_budget=1500 both set the run's length: give one of them"
            in train_refusal(tmp_path / "both", *FAST, "data.token_budget=1500"))


def test_documents_apart_reach_the_loss_and_an_unknown_setting_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """data.documents=apart: every training and validation step's loss gets its blocks'
    position_ids (each input token's position in its document: 0 at each separator and at the
    block's start); an architecture that cannot keep documents apart, or an unknown setting, is
    refused in one line before anything is built."""
    calls = []
    loss = mcsd.CausalLM.loss

    def recorded(model: mcsd.CausalLM, input_ids: torch.Tensor, *arguments: object, **keywords: object) -> object:
        if input_ids.device.type != "meta":  # not the FLOP count on the meta device (elementwise masks: no FLOPs)
            calls.append((input_ids, keywords.get("position_ids")))
        return loss(model, input_ids, *arguments, **keywords)

    monkeypatch.setattr(mcsd.CausalLM, "loss", recorded)
    train(compose_train(tmp_path / "apart", *FAST, "trainer.max_steps=2", "data.documents=apart", "logger=csv",
                        "test_after_training=false"))
    assert len(calls) >= 2 + 2 and all(position_ids is not None for _, position_ids in calls)
    eos = Tokenizer.from_file(str(tmp_path / "apart" / "model" / "tokenizer.json")).token_to_id("<|endoftext|>")
    for input_ids, position_ids in calls:
        assert position_ids.shape == input_ids.shape and (position_ids[:, 0] == 0).all()
        assert torch.equal((position_ids == 0)[:, 1:], (input_ids == eos)[:, 1:])
    assert "data.documents=separate is unknown: use one of joined, apart" in train_refusal(
        tmp_path / "unknown", *FAST, "data.documents=separate")


def test_a_run_resolves_its_model_once_and_builds_it_once_on_the_meta_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``mcsd-train`` turns its ``model`` node into a config once (equal-size widths) and builds
    one model on the meta device, which the checks (``data.documents=apart``) and the memory plan
    both read, before the one it trains."""
    from mcsd.models import build

    resolved, built = [], []
    make_config, init = build.make_config, mcsd.CausalLM.__init__

    def counted_make_config(node: object) -> object:
        if not isinstance(node, mcsd.LMConfig):  # a config already resolved passes through
            resolved.append(node)
        return make_config(node)

    def counted_init(model: mcsd.CausalLM, *arguments: object, **keywords: object) -> None:
        built.append(model)
        init(model, *arguments, **keywords)

    monkeypatch.setattr(build, "make_config", counted_make_config)
    monkeypatch.setattr("mcsd.training.run.make_config", counted_make_config)
    monkeypatch.setattr(mcsd.CausalLM, "__init__", counted_init)
    train(compose_train(tmp_path, *FAST, "trainer.max_steps=2", "data.documents=apart", "logger=csv",
                        "test_after_training=false"))
    assert len(resolved) == 1 and [next(model.parameters()).device.type for model in built] == ["meta", "cpu"]
    assert (tmp_path / "model" / "model.safetensors").is_file()


def test_bf16_mixed_precision_trains(tmp_path: Path) -> None:
    train(compose_train(tmp_path, *FAST, "trainer.max_steps=3", "trainer.precision=bf16-mixed", "logger=csv"))
    losses = series(read_metrics(tmp_path), "train/loss")
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses.values())


@pytest.mark.slow
@pytest.mark.inductor
def test_compiled_model_trains_like_the_eager_one(tmp_path: Path) -> None:
    """``compile=true`` trains the losses and the saved model of the eager run, with its documents
    apart (``data.documents=apart``): inductor's forward and backward given position_ids (the
    suite's one compile of them), and the second step's loss after the first step's compiled
    gradients. (The joined loss compiled, with its gradients, for every architecture:
    test_compiled_loss_equals_the_eager_loss_and_gradients.)"""
    overrides = [*FAST, "model.num_layers=1", "trainer.max_steps=2", "logger=csv", "validate_before_training=false",
                 "test_after_training=false", "data.documents=apart"]  # one layer: compiling takes time per layer
    train(compose_train(tmp_path / "eager", *overrides))
    train(compose_train(tmp_path / "compiled", *overrides, "compile=true"))
    eager, compiled = (series(read_metrics(tmp_path / name), "train/loss") for name in ("eager", "compiled"))
    assert sorted(compiled) == [0, 1]
    assert [compiled[step] for step in (0, 1)] == pytest.approx([eager[step] for step in (0, 1)], rel=1e-4)
    assert mcsd.load(tmp_path / "compiled").config == mcsd.load(tmp_path / "eager").config


def loss_case(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of ``length`` tokens, the first four targets of row 0 not scored."""
    ids = torch.randint(0, 101, (2, length + 1))
    inputs, targets = ids[:, :-1], ids[:, 1:].clone()
    targets[0, :4] = -100
    return inputs, targets


def loss_and_gradients(function: Callable, model: mcsd.CausalLM, inputs: torch.Tensor,
                       targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``function``'s loss and logits on (inputs, targets) and the model's gradients of the loss."""
    loss, logits = function(inputs, targets)
    loss.backward()
    gradients = [parameter.grad.clone() for parameter in model.parameters()]
    model.zero_grad(set_to_none=True)
    return loss.detach(), logits.detach(), gradients


@pytest.mark.parametrize("name", registry.architectures())
def test_compiled_loss_equals_the_eager_loss_and_gradients(name: str) -> None:
    """``loss_function(compile=True)`` (what ``compile=true`` trains and mcsd-bench times, compiled
    for the block length it is given; traced by dynamo and AOTAutograd, tests/conftest.py): the
    eager loss, logits and gradients up to float rounding at a length of several chunks (not a
    multiple of the chunk), cached per model. Inductor's own compile of a loss:
    test_compiled_model_trains_like_the_eager_one and the hybrid's case of the test below."""
    torch._dynamo.reset()
    model = tiny_model_to_compile(name).train()  # chunk size 16
    compiled = model.loss_function(compile=True)
    assert model.loss_function(compile=True) is compiled and model.loss_function() == model.loss
    inputs, targets = loss_case(40)
    eager_loss, eager_logits, eager_grads = loss_and_gradients(model.loss, model, inputs, targets)
    loss, logits, grads = loss_and_gradients(compiled, model, inputs, targets)
    scored = targets != -100  # the mean over the scored positions only
    assert eager_loss.item() == pytest.approx(
        torch.nn.functional.cross_entropy(eager_logits[scored], targets[scored]).item(), rel=1e-6)
    assert loss.item() == pytest.approx(eager_loss.item(), rel=1e-6)
    assert relative_rms_error(logits, eager_logits) < 1e-6
    # Per element, rounding-sized: some gradients (the hybrid's skips) are ~1e-6 in all.
    assert all(torch.allclose(grad, eager, rtol=1e-4, atol=1e-8) for grad, eager in zip(grads, eager_grads))
    # The cached compiled functions (loss and step) do not keep the model alive.
    model.step_function(compile=True)
    model_ref = weakref.ref(model)
    del model, compiled
    gc.collect()
    assert model_ref() is None


# The hybrid's case through inductor: its graph, broken at the CPU's attention over documents, once
# replayed an output with garbage sizes there (issue 65); the others trace without inductor.
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.inductor if name == "wonderful_matrices" else ())
                                  for name in registry.architectures()])
def test_compiled_loss_keeps_documents_apart(name: str) -> None:
    """The compiled loss given position_ids gives the eager loss and gradients, twice: RWKV-4's
    intra-chunk weights are recomputed in the backward there (a checkpoint only compiled); on a
    CPU, attention with documents apart runs outside the compiled graph (its SDPA calls follow the
    documents), and the second call replays the graph's outputs (the hybrid's once read garbage
    sizes there, in inductor's graph)."""
    torch._dynamo.reset()
    model = tiny_model_to_compile(name).train()
    inputs, targets = loss_case(40)
    position_ids = torch.cat([torch.arange(length) for length in (17, 1, 22)])[None].repeat(2, 1)
    eager, compiled = (functools.partial(function, position_ids=position_ids, form=model.default_form)
                       for function in (model.loss, model.loss_function(compile=True)))
    eager_loss, _, eager_grads = loss_and_gradients(eager, model, inputs, targets)
    for _ in range(2):
        loss, _, grads = loss_and_gradients(compiled, model, inputs, targets)
        assert loss.item() == pytest.approx(eager_loss.item(), rel=1e-6)
        assert all(torch.allclose(grad, eager, rtol=1e-4, atol=1e-8) for grad, eager in zip(grads, eager_grads))


@pytest.mark.parametrize("name", registry.architectures())
def test_the_loss_compiles_once_for_every_length(name: str) -> None:
    """Traced with the length dynamic from the start, the loss takes another length (other chunk
    counts, not a multiple of the chunk) without compiling again: nothing in the model specialises
    on the length. Dynamo's guards are the subject, so its graph runs through the ``eager``
    backend (a fifth of inductor's cold compile with symbolic lengths: issue 64)."""
    torch._dynamo.reset()
    model = tiny_model_to_compile(name).train()
    compiled = torch.compile(model.loss, backend="eager")
    for length in (40, 57):
        inputs, targets = loss_case(length)
        if length == 40:  # one graph for every length from the start
            torch._dynamo.mark_dynamic(inputs, 1)
            torch._dynamo.mark_dynamic(targets, 1)
        with torch.compiler.set_stance("fail_on_recompile" if length == 57 else "default"):
            loss, logits, grads = loss_and_gradients(compiled, model, inputs, targets)
        eager_loss, _, eager_grads = loss_and_gradients(model.loss, model, inputs, targets)
        assert loss.item() == pytest.approx(eager_loss.item(), rel=1e-6) and logits.shape == (2, length, 101)
        assert all(torch.allclose(grad, eager, rtol=1e-4, atol=1e-8) for grad, eager in zip(grads, eager_grads))


@pytest.mark.parametrize(("mode", "offline"), [(None, True), ("offline", True), ("online", False)])
def test_wandb_is_offline_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str | None,
                                       offline: bool) -> None:
    if mode is None:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    else:
        monkeypatch.setenv("WANDB_MODE", mode)
    assert compose_train(tmp_path).logger.wandb.offline is offline
    assert compose_train(tmp_path, "logger.wandb.offline=false").logger.wandb.offline is False


def test_the_report_says_why_test_and_validation_perplexities_differ() -> None:
    """The closing lines of a run whose small held-out splits disagree (the main job: test 4.7x
    validation) say why, and say nothing when they agree."""
    from types import SimpleNamespace

    from mcsd.training.report import end_of_run_report as _report

    trainer = SimpleNamespace(overfit_batches=0, callback_metrics={}, checkpoint_callback=None)
    data = {"data/val_documents": 6, "data/val_held_out": True, "data/test_documents": 2, "data/test_held_out": True}
    apart = _report(trainer, [], [], 4.4039, 81.77, 1_228_800, test=(5.9616, 388.23), data=data).splitlines()
    assert apart[2] == ("(test perplexity is 4.7x validation: the validation and test splits are 6 and 2 whole documents, "
                        "so each reads what its few documents are like; data.val_documents / data.test_documents hold "
                        "out more; docs/training.md reads the main job's)")
    close = _report(trainer, [], [], 4.4039, 81.77, 1_228_800, test=(4.5, 90.0), data=data).splitlines()
    assert len(close) == 2 and close[1].startswith("final test perplexity: 90.00")


def test_flush_denormal_makes_the_cpu_read_denormals_as_zero_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """``flush_denormal=true``: arithmetic on a denormal fp32 gives 0 (x86 computes denormals many
    times slower); false (the default) leaves them; anything else is refused in one line."""
    from omegaconf import OmegaConf

    from mcsd.errors import MCSDError
    from mcsd.runtime import apply_flush_denormal

    denormal = torch.tensor([1e-40])
    apply_flush_denormal("mcsd-train", OmegaConf.create({"flush_denormal": False}))
    assert (denormal * 1.0).item() != 0.0
    try:
        with caplog.at_level("INFO", logger="mcsd"):
            apply_flush_denormal("mcsd-train", OmegaConf.create({"flush_denormal": True}))
        assert (denormal * 1.0).item() == 0.0 and (denormal * 1e30).item() == 0.0
    finally:
        torch.set_flush_denormal(False)
    assert "mcsd-train: denormal floats flushed to zero on the CPU (flush_denormal=true)" in caplog.text
    with pytest.raises(MCSDError, match="^flush_denormal=maybe must be true or false$"):
        apply_flush_denormal("mcsd-train", OmegaConf.create({"flush_denormal": "maybe"}))
