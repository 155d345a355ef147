"""Downstream evaluation: lm-eval's HFLM over the transformers model, mcsd-eval, Table 2, offline behaviour."""

from __future__ import annotations

import json
import math
import os
import signal
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
import yaml
from hydra import compose, initialize_config_module
from lm_eval.api.instance import Instance
from omegaconf import OmegaConf

import mcsd
from helpers.models import tiny_config, variant_cases
from helpers.runs import FAST, compose_train, run_cli, run_here
from mcsd.checkpoint.wandb_run import find_wandb_runs, read_wandb_run
from mcsd.data import LanguageModelDataModule
from mcsd.data.tokenizer import train_tokenizer
from mcsd.commands.evaluate import check_tasks, evaluate, language_model
from mcsd.errors import MCSDError
from mcsd.evaluation.local_tasks import LOCAL_TASKS, write_local_tasks
from mcsd.evaluation.table2 import PAPER_ROWS, table2_markdown
from mcsd.training.run import train
from mcsd.training.module import LanguageModelModule


# Relative change of the tiny model's local perplexity allowed under quantized weights: about ten
# times what was measured, both in bfloat16 (dtype=auto's on a CPU): int8 2.7e-3, int4 2e-3
# (162.72 -> 163.16, 162.40; int8 in fp32 moved it by 2e-5: most of int8's change is bfloat16's).
TOLERANCE = {"int8": 3e-2, "int4": 2e-2}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model trained for a few steps on the embedded corpus (its run directory)."""
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    train(compose_train(run_dir, *FAST, "trainer.max_steps=30", "optimizer.lr=3e-3", "logger=csv"))
    return run_dir


def evaluate_here(*overrides: str) -> dict:
    """mcsd-eval's task in this process (no Python of its own to start)."""
    with initialize_config_module("mcsd.conf", version_base="1.3"):
        return evaluate(compose("eval", overrides=list(overrides)))


def request(kind: str, *arguments: object) -> Instance:
    return Instance(request_type=kind, doc={}, arguments=arguments, idx=0)


def hflm(path: Path, batch_size: int):
    """What mcsd-eval scores with: lm-eval's HFLM over the saved model."""
    cfg = OmegaConf.create({"device": "cpu", "dtype": "auto", "batch_size": batch_size, "max_length": 2048})
    return language_model(mcsd.locate(path), cfg)


@pytest.mark.slow
def test_loglikelihoods_equal_the_forward_pass(checkpoint: Path) -> None:
    lm = hflm(checkpoint, batch_size=3)
    model, tokenizer = mcsd.load(checkpoint), mcsd.load_tokenizer(checkpoint)
    pairs = [("The for statement", " is used to iterate"), ("x", " = 1"), ("", "Hello world"),
             ("A much longer context about the with statement and context managers", " in Python."),
             ("import", " sys")]
    scored = lm.loglikelihood([request("loglikelihood", *pair) for pair in pairs])
    eos = tokenizer.token_to_id("<|endoftext|>")
    for (context, continuation), (logprob, greedy) in zip(pairs, scored):
        whole = tokenizer.encode(context + continuation).ids
        context_ids = tokenizer.encode(context).ids if context else [eos]
        target = whole[len(context_ids):] if context else tokenizer.encode(continuation).ids
        ids = torch.tensor([(context_ids + target)[:-1]])
        with torch.no_grad():
            log_probs = F.log_softmax(model(ids, form="parallel")[0, -len(target):], dim=-1)
        expected = float(log_probs.gather(-1, torch.tensor(target)[:, None]).sum())
        assert logprob == pytest.approx(expected, rel=1e-5, abs=1e-4)
        assert greedy == bool((log_probs.argmax(-1) == torch.tensor(target)).all())


@pytest.mark.parametrize("case", variant_cases())
def test_every_architecture_scores_through_hflm(case: str, tmp_path: Path) -> None:
    """HFLM reads any registered architecture and variant: a saved tiny model's loglikelihoods
    (and a whole text's, rolling from the <|endoftext|> prefix) are its forward pass's."""
    text = "the king of a far land ships gold and silver to every harbour along the coast " * 20
    tokenizer = train_tokenizer([text], 300)
    model = mcsd.build_model(tiny_config(case, vocab_size=300)).eval()
    mcsd.save(model, tmp_path / "model", tokenizer)
    lm = hflm(tmp_path / "model", batch_size=2)
    pairs = [("the king of", " a far land"), ("gold and", " silver to every harbour")]
    scored = lm.loglikelihood([request("loglikelihood", *pair) for pair in pairs])
    for (context, continuation), (logprob, _) in zip(pairs, scored):
        context_ids, target = tokenizer.encode(context).ids, tokenizer.encode(continuation).ids
        assert tokenizer.encode(context + continuation).ids == context_ids + target
        with torch.no_grad():
            log_probs = F.log_softmax(model(torch.tensor([(context_ids + target)[:-1]]))[0, -len(target):], dim=-1)
        assert logprob == pytest.approx(float(log_probs.gather(-1, torch.tensor(target)[:, None]).sum()), rel=1e-5)
    document = "gold and silver to every harbour along the coast"
    (rolling,) = lm.loglikelihood_rolling([request("loglikelihood_rolling", document)])
    ids = [tokenizer.token_to_id("<|endoftext|>"), *tokenizer.encode(document).ids]
    with torch.no_grad():
        log_probs = F.log_softmax(model(torch.tensor([ids[:-1]]))[0], dim=-1)
    assert rolling == pytest.approx(float(log_probs.gather(-1, torch.tensor(ids[1:])[:, None]).sum()), rel=1e-5)


@pytest.mark.slow
def test_generate_until_stops_at_the_stop_string_and_equals_generate(checkpoint: Path) -> None:
    lm = hflm(checkpoint, batch_size=1)
    model, tokenizer = mcsd.load(checkpoint), mcsd.load_tokenizer(checkpoint)
    prompt = "The try statement"
    ids = torch.tensor([tokenizer.encode(prompt).ids])
    new = model.generate(ids, 24)[0, ids.shape[1]:].tolist()
    eos = tokenizer.token_to_id("<|endoftext|>")
    greedy_text = tokenizer.decode(new[: new.index(eos)] if eos in new else new)
    assert len(greedy_text) > 8
    stop = greedy_text[5:8]
    (until_stop, unbounded) = lm.generate_until([
        request("generate_until", prompt, {"until": [stop], "max_gen_toks": 24}),
        request("generate_until", prompt, {"until": ["\u2603 never"], "max_gen_toks": 24}),
    ])
    assert until_stop == greedy_text[: greedy_text.index(stop)]
    assert unbounded == greedy_text


@pytest.mark.slow
def test_mcsd_eval_runs_the_local_tasks_offline(checkpoint: Path, tmp_path: Path) -> None:
    result = run_cli("mcsd-eval", f"ckpt={checkpoint}", "tasks=local", "limit=8", "wandb.enabled=true",
                     cwd=tmp_path, env={"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "WARNING" not in result.stderr  # the bundled tasks state every metric's aggregation
    assert "not a git repository" not in result.stderr  # tmp_path is outside any checkout
    (run,) = (tmp_path / "logs" / "eval" / "runs").iterdir()
    results = json.loads((run / "results.json").read_text())["results"]
    assert 0.0 <= results["mcsd_local_mc"]["acc,none"] <= 1.0
    assert results["mcsd_local_ppl"]["bits_per_byte,none"] > 0
    assert results["mcsd_local_ppl"]["token_perplexity,none"] > 1
    table = (run / "table2.md").read_text()
    assert "| Mamba (quoted from the paper) | 2.8B | 36.3 | 69.7 | 63.5 | 26.2 | 66.1 | 52.4 |" in table
    assert "(ours, measured) | 0.2M | - | - | - | - | - | - |" in table
    (wandb_file,) = find_wandb_runs(run)  # each task's numbers in the summary, as it finished
    logged = read_wandb_run(wandb_file)
    assert (logged.group, logged.job_type, logged.exit_code) == (f"eval/{run.name}", "eval", 0)
    assert logged.summary["eval/mcsd_local_mc/acc"] == results["mcsd_local_mc"]["acc,none"]
    assert logged.summary["eval/mcsd_local_ppl/token_perplexity"] == results["mcsd_local_ppl"]["token_perplexity,none"]
    assert logged.config["trained_runs"] == []  # its training logged to CSV alone


@pytest.mark.slow
def test_mcsd_eval_scores_quantized_weights(checkpoint: Path, tmp_path: Path) -> None:
    """``mcsd-eval weights=int8|int4`` scores the model with its linear layers quantized (in
    bfloat16, which ``dtype=auto`` picks for both on a CPU): the same task's perplexity moves, by
    no more than the tolerance measured on this tiny model, and the results and the table say
    which weights were scored."""
    perplexities = {}
    for weights in ("full", "int8", "int4"):
        output_dir = tmp_path / weights
        evaluate_here(f"ckpt={checkpoint}", "tasks=[mcsd_local_ppl]", f"include_path={write_local_tasks(tmp_path)}",
                      "limit=8", f"weights={weights}", "wandb.enabled=false", f"paths.output_dir={output_dir}")
        summary = json.loads((output_dir / "results.json").read_text())
        assert summary["config"]["weights"] == weights
        perplexities[weights] = summary["results"]["mcsd_local_ppl"]["token_perplexity,none"]
        label_says = f"({weights} weights)" in (output_dir / "table2.md").read_text()
        assert label_says == (weights != "full")
    assert perplexities["int8"] != perplexities["full"] != perplexities["int4"]
    assert perplexities["int8"] == pytest.approx(perplexities["full"], rel=TOLERANCE["int8"])
    assert perplexities["int4"] == pytest.approx(perplexities["full"], rel=TOLERANCE["int4"])


@pytest.mark.slow
def test_mcsd_eval_scores_a_step_checkpoint_under_paths_log_dir(checkpoint: Path, tmp_path: Path) -> None:
    step = checkpoint / "checkpoints" / "step-000015.ckpt"
    result = run_here("mcsd-eval", f"ckpt={step}", "tasks=local", "limit=4", "wandb.enabled=false",
                      "paths.log_dir=elsewhere", cwd=tmp_path, env={"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert [path.name for path in tmp_path.iterdir()] == ["elsewhere"]
    (run,) = (tmp_path / "elsewhere" / "eval" / "runs").iterdir()
    summary = json.loads((run / "results.json").read_text())
    assert summary["model"] == str(step) and summary["results"]["mcsd_local_ppl"]["token_perplexity,none"] > 1
    assert "| **MCSD run/step-000015** (ours, measured) |" in (run / "table2.md").read_text()


@pytest.mark.slow
def test_ctrl_c_keeps_the_tasks_finished(checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during the first of the two local tasks: it finishes, the second never starts;
    results.json holds the first (complete: false) with the scores of the uninterrupted run;
    exit status 130."""
    import lm_eval

    evaluated = []
    real = lm_eval.simple_evaluate

    def task_then_ctrl_c(**arguments):
        evaluated.append(arguments["tasks"])
        os.kill(os.getpid(), signal.SIGINT)  # arrives while the task runs, as a Ctrl-C would
        return real(**arguments)

    common = [f"ckpt={checkpoint}", "tasks=local", "limit=4", "wandb.enabled=false"]
    monkeypatch.setattr(lm_eval, "simple_evaluate", task_then_ctrl_c)
    try:
        with pytest.raises(SystemExit) as stopped:
            evaluate_here(*common, f"paths.output_dir={tmp_path / 'stopped'}")
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the app leaves Ctrl-C ignored as it exits
    assert stopped.value.code == 130 and evaluated == [["mcsd_local_mc"]]
    kept = json.loads((tmp_path / "stopped" / "results.json").read_text())
    assert kept["complete"] is False and kept["tasks"] == ["mcsd_local_mc"]
    assert kept["tasks_planned"] == ["mcsd_local_mc", "mcsd_local_ppl"]
    monkeypatch.setattr(lm_eval, "simple_evaluate", real)
    whole = evaluate_here(*common, f"paths.output_dir={tmp_path / 'whole'}")
    assert set(whole) == {"mcsd_local_mc", "mcsd_local_ppl"}
    assert kept["results"]["mcsd_local_mc"]["acc,none"] == whole["mcsd_local_mc"]["acc,none"]
    # resume=true runs only the task the interrupted run lacks, and ends where the whole run ended.
    evaluated.clear()
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda **arguments: evaluated.append(arguments["tasks"]) or real(**arguments))
    resumed = evaluate_here(*common, f"paths.output_dir={tmp_path / 'stopped'}", "resume=true")
    def numbers(results: dict) -> dict:
        return {task: {key: value for key, value in metrics.items() if isinstance(value, float)}
                for task, metrics in results.items()}

    assert evaluated == [["mcsd_local_ppl"]] and numbers(resumed) == numbers(whole)
    summary = json.loads((tmp_path / "stopped" / "results.json").read_text())
    assert summary["complete"] is True and summary["tasks"] == summary["tasks_planned"]
    assert (tmp_path / "stopped" / "table2.md").read_text() == (tmp_path / "whole" / "table2.md").read_text()
    with pytest.raises(MCSDError, match=r"resume=true: the results in .* were scored with limit=4 and this run has "
                                        r"limit=2: resume with the same setting"):
        evaluate_here(f"ckpt={checkpoint}", "tasks=local", "limit=2", "wandb.enabled=false",
                      f"paths.output_dir={tmp_path / 'stopped'}", "resume=true")


def test_tasks_of_the_include_path_alone_need_no_index_of_lm_evals_own(tmp_path: Path) -> None:
    """tasks=local (or a folder of one's own tasks): the manager indexes that folder alone, not
    lm-eval's ~13,000 task files (about 12 s here)."""
    folder = write_local_tasks(tmp_path / "tasks")
    manager = check_tasks(list(LOCAL_TASKS), str(folder.resolve()))
    assert sorted(manager.all_tasks) == sorted(LOCAL_TASKS)


def test_table2_average_needs_all_five_tasks() -> None:
    full = {task: {"acc,none": 0.25, "acc_norm,none": 0.5} for task in
            ["arc_challenge", "arc_easy", "winogrande", "mmlu", "hellaswag"]}
    table = table2_markdown([("MCSD small", 1_836_672, full)])
    assert len(table.splitlines()[2:2 + len(PAPER_ROWS)]) == len(PAPER_ROWS)
    assert "| **MCSD small** (ours, measured) | 1.8M | 50.0 | 50.0 | 25.0 | 25.0 | 50.0 | 40.0 |" in table


def _exact_length_documents(tokenizer, length: int, count: int) -> list[str]:
    """Texts that tokenize to exactly ``length`` tokens (and back to themselves)."""
    from pydoc_data.topics import topics

    stream = tokenizer.encode(" ".join(topics[name] for name in sorted(topics))).ids
    documents = []
    for start in range(0, len(stream), length + 7):
        text = tokenizer.decode(stream[start : start + length])
        if len(tokenizer.encode(text).ids) == length and "<|endoftext|>" not in text:
            documents.append(text)
        if len(documents) == count:
            break
    return documents


@pytest.mark.slow
def test_rolling_perplexity_equals_the_harness_validation_perplexity(checkpoint: Path, tmp_path: Path) -> None:
    """On documents of exactly seq_len tokens every training block is <|endoftext|> + one
    document, which is what lm-eval's rolling log-likelihood scores: the two perplexities
    are the same number."""
    tokenizer, length = mcsd.load_tokenizer(checkpoint), 48
    documents = _exact_length_documents(tokenizer, length, 40)
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in documents))
    data = LanguageModelDataModule(source="text_files", paths=[str(corpus)], tokenizer_path=str(checkpoint / "model" /
                                   "tokenizer.json"), vocab_size=512, seq_len=length, batch_size=4,
                                   val_fraction=0.25, test_fraction=0.0, cache_dir=str(tmp_path / "cache"))
    val = data.build()["val"]
    val_blocks = torch.stack([val[index]["input_ids"] for index in range(len(val))])
    assert (val_blocks[:, 0] == tokenizer.token_to_id("<|endoftext|>")).all()
    module = LanguageModelModule(model=json.loads((checkpoint / "model" / "config.json").read_text()),
                                 optimizer=torch.optim.AdamW)
    module.model.load_state_dict(mcsd.load(checkpoint).state_dict())
    metrics = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False).validate(
        module, datamodule=data, verbose=False)[0]

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "val.jsonl").write_text("".join(json.dumps({"text": tokenizer.decode(block[1:].tolist())}) + "\n"
                                             for block in val_blocks))
    (tasks / "val_ppl.yaml").write_text(yaml.safe_dump({
        "task": "val_ppl", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(tasks / "val.jsonl")}},
        "test_split": "test", "output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{text}}",
        "metric_list": [{"metric": "word_perplexity"}], "metadata": {"version": 1.0}}))
    evaluate_here(f"ckpt={checkpoint}", "tasks=[val_ppl]", f"include_path={tasks}", "wandb.enabled=false",
                  f"paths.output_dir={tmp_path / 'eval'}")
    rolling = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]["val_ppl"]
    assert rolling["token_perplexity,none"] == pytest.approx(metrics["val/ppl"], rel=1e-4)
    assert math.log(rolling["token_perplexity,none"]) == pytest.approx(metrics["val/loss"], rel=1e-4)
