"""The context probe's result files (``mcsd-probe context``), owned here alone:
``context_curve.csv`` (the loss by position) and ``context_delta.csv`` (Delta_N with its
swapped-past control), each row tagged with the probed model's identity; their writer and reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CURVE_FILE, DELTA_FILE = "context_curve.csv", "context_delta.csv"
RESULT_FILES = (CURVE_FILE, DELTA_FILE)  # what a probe writes into its output_dir


def write(output_dir: Path, curve: Any, deltas: Any) -> list[Path]:
    """Write the probe's two tables (DataFrames); return their paths."""
    output_dir.mkdir(parents=True, exist_ok=True)
    curve.to_csv(output_dir / CURVE_FILE, index=False)
    deltas.to_csv(output_dir / DELTA_FILE, index=False)
    return [output_dir / CURVE_FILE, output_dir / DELTA_FILE]


def read_all(root: str | Path) -> tuple[Any, Any]:
    """Every probe result under ``root`` (each folder holding both files): the curves and the
    deltas, each row tagged with its ``probe`` folder (relative to ``root``)."""
    import pandas as pd

    root = Path(root)
    folders = sorted(path.parent for path in root.rglob(DELTA_FILE)) if root.is_dir() else []
    if not folders:
        raise FileNotFoundError(f"no {DELTA_FILE} under {root}: give the folder of one or more mcsd-probe context runs")
    curves = [pd.read_csv(folder / CURVE_FILE).assign(probe=str(folder.relative_to(root))) for folder in folders]
    deltas = [pd.read_csv(folder / DELTA_FILE).assign(probe=str(folder.relative_to(root))) for folder in folders]
    return pd.concat(curves, ignore_index=True), pd.concat(deltas, ignore_index=True)
