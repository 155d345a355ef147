"""mcsd-eval's result files, owned here alone: ``results.json`` (lm-eval's scores with what was
run: the model, its parameter count, the tasks finished and planned, the shots, the config) and
``table2.md`` (the paper's Table 2 with this model's row), written together; and their reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcsd.errors import MCSDError

RESULTS_FILE, TABLE_FILE = "results.json", "table2.md"
RESULT_FILES = (RESULTS_FILE, TABLE_FILE)  # what a run writes into its output_dir
SUMMARY_KEYS = ("model", "params", "tasks", "tasks_planned", "complete", "num_fewshot", "limit", "results", "n-shot",
                "versions", "config")


def write(output_dir: Path, summary: dict[str, Any], table: str) -> Path:
    """Write ``results.json`` (``summary``, which holds :data:`SUMMARY_KEYS`) and ``table2.md``;
    return the results' path."""
    missing = [key for key in SUMMARY_KEYS if key not in summary]
    if missing:
        raise ValueError(f"an eval summary needs {', '.join(missing)}")
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / RESULTS_FILE).write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (output_dir / TABLE_FILE).write_text(table)
    return output_dir / RESULTS_FILE


def read(path: str | Path) -> dict[str, Any]:
    """The summary in an mcsd-eval ``results.json`` (or the one in its output folder); a file that
    is not one is refused in one line."""
    path = Path(path)
    path = path / RESULTS_FILE if path.is_dir() else path
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise MCSDError(f"{path} is not a results file of mcsd-eval ({type(error).__name__}): give the "
                        f"{RESULTS_FILE} of an mcsd-eval run") from None
    if not isinstance(summary, dict) or not {"params", "results"} <= set(summary):
        raise MCSDError(f"{path} is not a results file of mcsd-eval (it lacks params or results): give the "
                        f"{RESULTS_FILE} of an mcsd-eval run")
    return summary


RESUME_MUST_MATCH = ("model", "num_fewshot", "limit")  # what a resumed run keeps of the earlier one's settings


def resumed(output_dir: Path, summary: dict[str, Any]) -> dict[str, Any] | None:
    """``resume=true``: the summary already in ``output_dir`` (``None`` where there is none), whose
    finished tasks a resumed run keeps; refused in one line when it scored another model or with
    other shots or another limit (:data:`RESUME_MUST_MATCH`: its numbers would not stand beside
    the new ones)."""
    if not (output_dir / RESULTS_FILE).is_file():
        return None
    earlier = read(output_dir / RESULTS_FILE)
    for key in RESUME_MUST_MATCH:
        if earlier.get(key) != summary[key]:
            raise MCSDError(f"resume=true: the results in {output_dir} were scored with {key}={earlier.get(key)!r} "
                            f"and this run has {key}={summary[key]!r}: resume with the same setting, or give another "
                            "output_dir")
    return earlier
