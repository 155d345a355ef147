"""The bench's result files, owned here alone: their schema, their writer and their readers.

An ``mcsd-bench`` output folder holds ``results.json`` (a header naming the machine and the
software, and the points as measured) and the tidy ``results.csv`` (one row per point, with the
header's fields as columns), both rewritten after every point. :data:`COLUMNS` is the schema: a
new grid axis is one more column here (and one in the plan, :mod:`mcsd.bench.plan`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcsd.errors import MCSDError

RESULTS_JSON, RESULTS_CSV = "results.json", "results.csv"
RESULT_FILES = (RESULTS_JSON, RESULTS_CSV)  # what a grid writes into its output_dir
MODES = ("inference", "train")
LABELS = {  # the columns that name a point (the plan's axes), in each mode
    "inference": ("model", "arch", "variant", "kernels", "weights", "runtime", "size", "batch", "prompt_len", "gen_len"),
    "train": ("model", "arch", "variant", "kernels", "form", "documents", "size", "batch", "seq_len",
              "activation_checkpointing"),
}
COLUMNS = {  # every column of results.csv but the header's, in order: the labels, then the measurement
    "inference": [*LABELS["inference"][:7], "params", "precision", *LABELS["inference"][7:], "prefill_s", "decode_s_per_token",
                  "latency_s", "tokens_per_s", "peak_mem_bytes", "weights_bytes", "peak_mem_minus_weights_bytes",
                  "state_bytes_per_sequence", "step_weight_bytes", "step_state_bytes_per_sequence", "step_read_bytes",
                  "read_bandwidth_bytes_per_s", "limit_ratio", "decode_s_per_token_min", "decode_s_per_token_max",
                  "unsteady", "threads", "other_cores", "shared", "compiled", "graphs_compiled_timed",
                  "graphs_recorded_timed", "point_s",
                  "measured_at", "status", "reason"],
    "train": [*LABELS["train"][:7], "params", "precision", *LABELS["train"][7:], "model_flops", "counted_flops", "step_s",
              "first_step_s", "tokens_per_s", "matmul_peak_flops", "peak_flops", "peak_source", "mfu", "peak_mem_bytes",
              "weights_bytes", "peak_mem_minus_weights_bytes", "step_s_min", "step_s_max", "unsteady", "threads",
              "other_cores", "shared", "compiled", "point_s", "measured_at", "status", "reason"],
}
REQUIRED = {  # the columns every results file of a mode has held since the first: what the figures read
    "inference": ("model", "batch", "gen_len", "status", "peak_mem_bytes", "latency_s", "tokens_per_s"),
    "train": ("model", "form", "batch", "seq_len", "status", "tokens_per_s", "peak_mem_bytes", "mfu"),
}
HEADER_COLUMNS = ("device", "dtype", "torch", "compile", "cuda_graphs", "complete", "points_planned", "stopped_by")
"""The header's fields results.csv repeats in every row (``dtype`` and ``git_commit`` are each row's own)."""
RESUME_MUST_MATCH = ("mode", "device", "dtype", "torch", "compile", "cuda_graphs")  # header fields a resumed grid keeps


def write(output_dir: Path, head: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[Path, Path]:
    """``results.json`` (header + points) and the tidy ``results.csv`` (header fields as columns)."""
    import pandas as pd

    output_dir.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = (output_dir / name for name in RESULT_FILES)
    json_path.write_text(json.dumps({"header": head, "points": rows}, indent=2) + "\n")
    frame = pd.DataFrame(rows).reindex(columns=COLUMNS[head["mode"]])
    for key in HEADER_COLUMNS:
        frame[key] = head[key]
    # The dtype each point ran in (int4, and int8 on a CPU, run in bfloat16 whatever dtype says): the row's own.
    frame["dtype"] = [row.get("dtype", head["dtype"]) for row in rows]
    # A resumed grid's rows come from several runs: each row's own commit (rows written before rows had one: the header's).
    frame["git_commit"] = [row.get("git_commit", head["git_commit"]) for row in rows]
    frame.to_csv(csv_path, index=False)
    return json_path, csv_path


def results_file(path: str | Path) -> Path:
    """The results file that ``path`` names: the file itself, or the ``results.csv`` of an
    mcsd-bench output folder."""
    path = Path(path)
    if path.is_dir():
        if (path / RESULTS_CSV).is_file():
            return path / RESULTS_CSV
        raise FileNotFoundError(f"{path} is a folder without a {RESULTS_CSV}: give the {RESULTS_CSV} (or the output_dir) "
                                "of an mcsd-bench run; a training sweep's folder is drawn by mcsd-plot scaling|ablation")
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: give the {RESULTS_CSV} or {RESULTS_JSON} of an mcsd-bench run")
    return path


def read(path: str | Path) -> tuple[dict[str, Any], Any]:
    """Header and points (a DataFrame) of a results file (``results.csv`` or ``results.json``, or
    its output folder); a file that is not one is refused in one line."""
    import pandas as pd

    path = results_file(path)
    try:
        if path.suffix == ".json":
            content = json.loads(path.read_text())
            return content["header"], pd.DataFrame(content["points"])
        frame = pd.read_csv(path)
    except (ValueError, KeyError, TypeError, pd.errors.ParserError) as error:
        raise MCSDError(f"{path} is not a results file of mcsd-bench ({type(error).__name__}): give its {RESULTS_CSV} "
                        f"or {RESULTS_JSON}") from None
    head = {key: frame[key].iloc[0] for key in (*HEADER_COLUMNS, "git_commit") if key in frame and len(frame)}
    return head, frame


def resumed_rows(output_dir: Path, head: dict[str, Any]) -> list[dict[str, Any]]:
    """``resume=true``: the rows of the results already in ``output_dir`` (none there: none), which
    the grid keeps and does not measure again; refused in one line when they were measured on
    another device, thread count, dtype, torch or compile setting (:data:`RESUME_MUST_MATCH`), whose
    numbers would not compare with the new rows'."""
    path = output_dir / RESULTS_JSON
    if not path.is_file():
        return []
    try:
        earlier = json.loads(path.read_text())
        earlier_head, rows = earlier["header"], list(earlier["points"])
    except (ValueError, KeyError, TypeError):
        raise MCSDError(f"resume=true: {path} is not an mcsd-bench results file: give an output_dir of a grid to "
                        "resume, or resume=false") from None
    for key in RESUME_MUST_MATCH:
        if earlier_head.get(key) != head[key]:
            raise MCSDError(f"resume=true: the results in {output_dir} were measured with {key}={earlier_head.get(key)!r} "
                            f"and this grid has {key}={head[key]!r}: resume with the same setting, or give another "
                            "output_dir")
    return [{**row, "git_commit": row.get("git_commit", earlier_head.get("git_commit"))} for row in rows]


def is_row_of(row: dict[str, Any], labels: dict[str, Any]) -> bool:
    """Whether ``row`` is the measurement of the point that ``labels`` name."""
    return all(row.get(key) == value for key, value in labels.items())


def measured(rows: list[dict[str, Any]], labels: list[dict[str, Any]]) -> int:
    """How many of the points that ``labels`` name ``rows`` measure."""
    return sum(any(is_row_of(row, point) for row in rows) for point in labels)
