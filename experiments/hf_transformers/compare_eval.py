"""lm-eval's own HFLM (what mcsd-eval runs now) against the hand-written lm-eval model it replaced
(``mcsd/evaluation/lm.py`` of commit 2a02f4d, read from git history), on the bundled local tasks:
every sample's log-likelihood, for a tiny model of every architecture and variant, and for any
saved models given.

    python experiments/hf_transformers/compare_eval.py --out experiments/hf_transformers/compare_eval.csv [MODEL ...]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from lm_eval import simple_evaluate
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

import mcsd
from mcsd.data.tokenizer import eos_id, train_tokenizer
from mcsd.evaluation.local_tasks import LOCAL_TASKS, write_local_tasks
from mcsd.hf import as_hf_model, as_hf_tokenizer

ADAPTER_COMMIT = "2a02f4d"
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tests"))
from conftest import tiny_config, variant_cases  # noqa: E402  the tests' tiny models of every variant


def old_adapter(folder: Path) -> type:
    """The deleted ``MCSDEvalModel``, from git history."""
    source = subprocess.run(["git", "show", f"{ADAPTER_COMMIT}:mcsd/evaluation/lm.py"], cwd=HERE, check=True,
                            capture_output=True, text=True).stdout
    (folder / "old_lm.py").write_text(source)
    spec = importlib.util.spec_from_file_location("old_lm", folder / "old_lm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MCSDEvalModel


def sample_loglikelihoods(lm, manager: TaskManager, limit: int) -> dict[str, list[float]]:
    outcome = simple_evaluate(model=lm, tasks=LOCAL_TASKS, limit=limit, task_manager=manager, log_samples=True,
                              random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    return {task: [float(value[0]) if isinstance(value, (list, tuple)) else float(value)
                   for sample in outcome["samples"][task] for value in sample["resps"] for value in value]
            for task in LOCAL_TASKS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path, help="saved models to compare as well")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=12)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    adapter = old_adapter(work)
    manager = TaskManager(include_path=str(write_local_tasks(work / "tasks")))
    from pydoc_data.topics import topics

    tokenizer = train_tokenizer([" ".join(topics[name] for name in sorted(topics))[:200_000]], 400)
    models = {}
    for index, case in enumerate(variant_cases()):
        torch.manual_seed(index)
        models[case] = mcsd.save(mcsd.build_model(tiny_config(case, vocab_size=400)).eval(), work / str(index),
                                 tokenizer)
    models.update({str(path): path for path in args.models})
    rows = []
    for name, path in models.items():
        model, model_tokenizer = mcsd.load(path), mcsd.load_tokenizer(path)
        hflm = HFLM(pretrained=as_hf_model(model, eos_id(model_tokenizer)).eval(),
                    tokenizer=as_hf_tokenizer(model_tokenizer), batch_size=4, max_length=2048)
        old, new = (sample_loglikelihoods(lm, manager, args.limit) for lm in (adapter(str(path), batch_size=4), hflm))
        for task in LOCAL_TASKS:
            differences = [abs(a - b) for a, b in zip(old[task], new[task], strict=True)]
            rows.append({"model": name, "task": task, "loglikelihoods": len(differences),
                         "max_abs_difference": max(differences), "equal": all(d == 0 for d in differences)})
            print(rows[-1], flush=True)
    with args.out.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
