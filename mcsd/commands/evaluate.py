"""mcsd-eval: evaluate a trained model on lm-evaluation-harness tasks.

    mcsd-eval ckpt=logs/train/runs/<run> tasks=table2            # the paper's Table 2, 5-shot
    mcsd-eval ckpt=... tasks=[arc_easy,lambada_openai] limit=100
    mcsd-eval ckpt=... tasks=local                                # bundled offline tasks
    mcsd-eval ckpt=... tasks=[my_task] include_path=my_tasks/     # your own task YAMLs
    mcsd-eval ckpt=... paths.output_dir=<an interrupted run> resume=true   # only the tasks it lacks
Writes results.json, table2.md (and a W&B table) to the run directory, after every task. The model is scored by
lm-eval's own ``HFLM``, over the model as a Hugging Face ``transformers`` model (:mod:`mcsd.hf`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
from pathlib import Path
from typing import Any
from unittest import mock

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from mcsd.checkpoint import eval_results
from mcsd.checkpoint.eval_results import RESULT_FILES, RESULTS_FILE, TABLE_FILE
from mcsd.checkpoint.saved_model import SavedModel, load, load_tokenizer, locate
from mcsd.commands.app import hydra_app, refuse_onnx_export
from mcsd.runtime import git_commit, interrupted, require_wandb_login
from mcsd.data.corpus import hub_is_reachable
from mcsd.data.tokenizer import eos_id
from mcsd.errors import MCSDError
from mcsd.files import replace_earlier_results
from mcsd.jobs import CTRL_C, run_jobs
from mcsd.evaluation.local_tasks import LOCAL_TASKS, write_local_tasks
from mcsd.evaluation.table2 import TABLE2_TASKS, table2_markdown
from mcsd.hf import as_hf_model, as_hf_tokenizer
from mcsd.models import registry
from mcsd.training.dashboard import MeasurementRun
from mcsd.deploy.quantize import decoding_dtype, quantize_weights, weight_format


log = logging.getLogger("mcsd.eval")


def resolve_tasks(cfg: DictConfig, output_dir: Path) -> tuple[list[str], str | None, int | None]:
    """Task names, include path and shot count for ``cfg.tasks`` (``table2``, ``local`` or a list)."""
    tasks = cfg.tasks
    include_path = str(Path(cfg.include_path).resolve()) if cfg.include_path else None
    num_fewshot = cfg.num_fewshot
    if tasks == "table2":
        return list(TABLE2_TASKS), include_path, 5 if num_fewshot is None else num_fewshot
    if tasks == "local":
        return list(LOCAL_TASKS), str(write_local_tasks(output_dir / "local_tasks")), num_fewshot
    if isinstance(tasks, str):
        tasks = [name.strip() for name in tasks.split(",") if name.strip()]
    if not tasks:
        raise MCSDError("tasks is empty: name lm-eval tasks, e.g. tasks=[arc_easy] (or tasks=table2, tasks=local)")
    return list(tasks), include_path, num_fewshot


@functools.lru_cache(maxsize=4)
def task_manager(include_path: str | None, include_defaults: bool = True) -> Any:
    """lm-eval's TaskManager with ``include_path``'s tasks, and lm-eval's own unless
    ``include_defaults`` is false (its index of every task, about 13,000 YAML files, takes ~12 s
    to build here: built once per process, and only when a task needs it)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path, include_defaults=include_defaults)


def check_tasks(tasks: list[str], include_path: str | None) -> Any:
    """An lm-eval TaskManager that knows every task: ``include_path``'s alone when every task is a
    plain task there (tasks=local, a folder of one's own tasks), else one with lm-eval's too; hub
    tasks need the Hub to be reachable."""
    from lm_eval.tasks._index import Kind

    own = task_manager(include_path, False) if include_path else None
    if own is not None and all(task in own.task_index and own.task_index[task].kind in (Kind.TASK, Kind.PY_TASK)
                               for task in tasks):
        manager = own
    else:
        manager = task_manager(include_path)
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        raise MCSDError(f"tasks: {unknown[0]} is not an lm-eval task (list them with `lm_eval ls tasks`; "
                        "local YAML tasks need include_path=DIR)")
    local_root = Path(include_path) if include_path else None
    remote = [task for task in tasks if not (local_root and manager.task_index[task].yaml_path
                                             and local_root in manager.task_index[task].yaml_path.resolve().parents)]
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"
    if remote and not offline and not hub_is_reachable():
        raise MCSDError(f"task {remote[0]} downloads its data from the Hugging Face Hub, which is unreachable "
                        "from here: evaluate local task YAMLs with include_path=DIR (tasks=local runs the bundled ones)")
    return manager


def token_perplexity(samples: list[dict[str, Any]], tokenizer: Any) -> float:
    """exp(-sum log p / tokens) over a rolling task's documents: comparable to training's val/ppl
    (``tokenizer``: the model's, as a ``transformers`` tokenizer)."""
    total, count = 0.0, 0
    for sample in samples:
        total += float(sample["filtered_resps"][0] if isinstance(sample["filtered_resps"], list)
                       else sample["filtered_resps"])
        count += len(tokenizer(sample["target"], add_special_tokens=False).input_ids)
    return math.exp(-total / count)


class _DropModelInstanceNote(logging.Filter):
    """HFLM warns that a model given as an object ignores its loading arguments: mcsd-eval gives
    it the model it loaded itself, and the arguments it needs (batch size, context length)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "`pretrained` model kwarg is not of type `str`" not in str(record.msg)


def language_model(saved: SavedModel, cfg: DictConfig) -> Any:
    """lm-eval's own ``HFLM`` over the saved model as a ``transformers`` model, with its tokenizer."""
    from lm_eval.models.huggingface import HFLM

    logging.getLogger("lm_eval.models.huggingface").addFilter(_DropModelInstanceNote())
    weights = cfg.get("weights", "full")
    model = quantize_weights(load(saved, device=cfg.device, dtype=decoding_dtype(cfg.dtype, weights, cfg.device)),
                             weights)
    tokenizer = load_tokenizer(saved)
    return HFLM(pretrained=as_hf_model(model, eos_id(tokenizer)), tokenizer=as_hf_tokenizer(tokenizer),
                batch_size=cfg.batch_size, max_length=cfg.max_length)


def check_settings(cfg: DictConfig) -> None:
    """The numbers lm-eval takes, refused in one line before anything is loaded or written."""
    def positive_int(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1

    limit = cfg.limit
    if limit is not None and not positive_int(limit) and not (
            isinstance(limit, float) and 0 < limit < 1):
        raise MCSDError(f"limit={limit} must be a number of documents per task (e.g. limit=100), a fraction of them "
                        "below 1 (limit=0.1), or null for all")
    for key in ("batch_size", "max_length"):
        if not positive_int(cfg[key]):
            raise MCSDError(f"{key}={cfg[key]} must be a positive whole number")
    if cfg.num_fewshot is not None and (not isinstance(cfg.num_fewshot, int) or isinstance(cfg.num_fewshot, bool)
                                        or cfg.num_fewshot < 0):
        raise MCSDError(f"num_fewshot={cfg.num_fewshot} must be a whole number of examples, 0 or more (or null)")


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Run lm-eval on ``cfg.ckpt``, one task after another, and write the results; return
    lm-eval's results dict. Ctrl-C stops after the task under way (again: at once) and writes
    the results of the tasks finished (``complete: false`` in results.json)."""
    from lm_eval import simple_evaluate

    if cfg.wandb.enabled and not cfg.wandb.offline:
        require_wandb_login("wandb")
    check_settings(cfg)
    refuse_onnx_export("mcsd-eval", cfg.ckpt, "give the model folder or run it was exported from")
    saved = locate(cfg.ckpt)
    decoding_dtype(cfg.dtype, cfg.get("weights", "full"), cfg.device)  # refused before anything is written
    output_dir = Path(cfg.output_dir)
    replace_earlier_results(output_dir, list(RESULT_FILES), "mcsd-eval", cfg.get("overwrite", False),
                            resume="resume=true to keep its tasks finished and run only the rest",
                            resuming=bool(cfg.get("resume")))
    lm = language_model(saved, cfg)  # a checkpoint it cannot read is refused before the run folder holds anything
    output_dir.mkdir(parents=True, exist_ok=True)
    tasks, include_path, num_fewshot = resolve_tasks(cfg, output_dir)
    earlier = (eval_results.resumed(output_dir, {"model": str(saved.path), "num_fewshot": num_fewshot, "limit": cfg.limit})
               if cfg.get("resume") else None)
    kept = [task for task in (earlier or {}).get("tasks", []) if task in tasks]
    if earlier is not None:
        log.info("resume=true: %d of the %d tasks already scored in %s (%s), %d to run", len(kept), len(tasks),
                 output_dir, ", ".join(kept) or "none", len(tasks) - len(kept))
    manager = check_tasks(tasks, include_path)
    model = lm.model.model  # the project's CausalLM inside the transformers model
    params = sum(p.numel() for p in model.parameters())
    label = f"{registry.of_config(model.config).label} {saved.name}" + (
        f" ({weight_format(model)} weights)" if weight_format(model) != "full" else "")
    wandb_run = (MeasurementRun("eval", cfg.wandb, OmegaConf.to_container(cfg, resolve=True), output_dir,
                                [cfg.ckpt])
                 if cfg.wandb.enabled else contextlib.nullcontext())
    with wandb_run:
        results: dict[str, Any] = {name: (earlier or {}).get("results", {})[name] for name in
                                   (earlier or {}).get("results", {}) if _task_of(name, kept)}
        shots: dict[str, Any] = {name: value for name, value in (earlier or {}).get("n-shot", {}).items()
                                 if _task_of(name, kept)}
        versions: dict[str, Any] = {name: value for name, value in (earlier or {}).get("versions", {}).items()
                                    if _task_of(name, kept)}
        finished = list(kept)

        def write() -> None:  # after every task: a run killed outright keeps the tasks it finished
            summary = {"model": str(saved.path), "params": params, "tasks": [task for task in tasks if task in finished],
                       "tasks_planned": tasks, "complete": set(finished) == set(tasks), "num_fewshot": num_fewshot,
                       "limit": cfg.limit, "results": results, "n-shot": shots, "versions": versions,
                       "config": OmegaConf.to_container(cfg, resolve=True)}
            eval_results.write(output_dir, summary, table2_markdown([(label, params, results)]))

        def score(task: str, bar: Any) -> None:
            outcome = simple_evaluate(model=lm, tasks=[task], num_fewshot=num_fewshot, limit=cfg.limit,
                                      task_manager=manager, log_samples=True, random_seed=cfg.seed,
                                      numpy_random_seed=cfg.seed, torch_random_seed=cfg.seed,
                                      fewshot_random_seed=cfg.seed)
            for name, samples in outcome.get("samples", {}).items():
                scores = outcome["results"].get(name, {})
                if manager.task_index.get(name) and samples and "word_perplexity,none" in scores:
                    scores["token_perplexity,none"] = token_perplexity(samples, lm.tokenizer)
            results.update(outcome["results"])
            shots.update(outcome.get("n-shot") or {})
            versions.update(outcome.get("versions") or {})
            finished.append(task)
            write()
            if cfg.wandb.enabled:  # each task's numbers as it finishes: an interrupted run keeps them
                wandb_run.record({}, {f"eval/{row[0]}/{row[1]}": row[2] for row in _score_rows(outcome["results"])})

        # lm-eval asks git for the hash of the working folder, whose "fatal: not a git repository"
        # outside a checkout reaches the user's terminal: it records this package's commit instead.
        with mock.patch("lm_eval.evaluator.get_git_commit_hash", git_commit):  # one task at a time: Ctrl-C keeps those finished
            stopped = run_jobs([task for task in tasks if task not in kept], score, desc="mcsd-eval", each="task",
                               unit="task", done=len(kept), postfix=str).stopped_by == CTRL_C
        if not finished:
            interrupted("mcsd-eval", "stopped before the first task was finished: nothing written")
        write()
        if cfg.wandb.enabled:
            wandb_run.table("eval/results", pd.DataFrame(_score_rows(results), columns=["task", "metric", "value"]))
        if stopped:
            interrupted("mcsd-eval", f"kept the results of the {len(finished)} of {len(tasks)} tasks finished "
                        f"({', '.join(finished)}) in {output_dir / RESULTS_FILE} (complete: false) and {TABLE_FILE}")
    lines = [f"{task}: " + ", ".join(f"{key.split(',')[0]}={value:.4f}" for key, value in metrics.items()
                                     if isinstance(value, float) and "stderr" not in key)
             for task, metrics in results.items()]
    print("\n".join(lines) + f"\nresults: {output_dir / RESULTS_FILE}\ntable: {output_dir / TABLE_FILE}",
          flush=True)
    return results


def _task_of(name: str, tasks: list[str]) -> bool:
    """Whether lm-eval's result ``name`` belongs to one of ``tasks`` (a group's subtasks are
    reported under their own names, which carry the group's: ``mmlu_anatomy`` of ``mmlu``)."""
    return any(name == task or name.startswith(f"{task}_") for task in tasks)


def _score_rows(results: dict[str, Any]) -> list[tuple[str, str, float]]:
    """``(task, metric, value)`` of every number in lm-eval's ``results`` (the metric's name without its filter)."""
    return [(task, key.split(",")[0], value) for task, metrics in results.items() for key, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)]


@hydra_app("mcsd-eval", "eval")
def main(cfg: DictConfig) -> None:
    """Entry point of ``mcsd-eval``."""
    evaluate(cfg)


if __name__ == "__main__":
    main()
