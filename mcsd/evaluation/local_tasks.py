"""Small lm-eval tasks that need no download, generated from the embedded corpus.

``mcsd_local_mc`` (multiple choice: which of four continuations follows a passage of the
Python documentation) and ``mcsd_local_ppl`` (rolling log-likelihood of whole passages:
word/byte perplexity, bits per byte). They are written as lm-eval YAML task files over
JSONL data, the same format a user's own ``include_path`` folder holds.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import yaml

LOCAL_TASKS = ["mcsd_local_mc", "mcsd_local_ppl"]


def _passages(count: int, words: int) -> list[str]:
    """``count`` passages of ``words`` words from the pydoc topics, in a fixed order."""
    from pydoc_data.topics import topics

    passages = []
    for name in sorted(topics):
        tokens = topics[name].split()
        for start in range(0, len(tokens) - words, words * 4):
            passages.append(" ".join(tokens[start : start + words]))
    return random.Random(0).sample(passages, count)


def write_local_tasks(directory: str | Path, items: int = 40) -> Path:
    """Write both tasks (YAML + JSONL) into ``directory``; return it (an ``include_path``)."""
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    passages = _passages(2 * items, 36)
    questions = []
    for index in range(items):
        words = passages[index].split()
        context, answer = " ".join(words[:28]), " " + " ".join(words[28:])
        distractors = [" " + " ".join(passages[(index + shift) % items].split()[28:]) for shift in (7, 13, 29)]
        choices = [answer, *distractors]
        rng.shuffle(choices)
        questions.append({"context": context, "choices": choices, "label": choices.index(answer)})
    texts = [{"text": passage} for passage in passages[items:]]
    for name, rows in (("mcsd_local_mc", questions), ("mcsd_local_ppl", texts)):
        (directory / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    common = {"dataset_path": "json", "test_split": "test", "metadata": {"version": 1.0}}
    multiple_choice = {
        "task": "mcsd_local_mc", **common,
        "dataset_kwargs": {"data_files": {"test": str(directory / "mcsd_local_mc.jsonl")}},
        "output_type": "multiple_choice", "doc_to_text": "{{context}}", "doc_to_choice": "{{choices}}",
        "doc_to_target": "{{label}}",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}],
    }
    rolling = {
        "task": "mcsd_local_ppl", **common,
        "dataset_kwargs": {"data_files": {"test": str(directory / "mcsd_local_ppl.jsonl")}},
        "output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{text}}",
        "metric_list": [  # lm-eval's own aggregations for these metrics, stated so that it need not warn
            {"metric": "word_perplexity", "aggregation": "weighted_perplexity", "higher_is_better": False},
            {"metric": "byte_perplexity", "aggregation": "weighted_perplexity", "higher_is_better": False},
            {"metric": "bits_per_byte", "aggregation": "bits_per_byte", "higher_is_better": False},
        ],
    }
    for config in (multiple_choice, rolling):
        (directory / f"{config['task']}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return directory
