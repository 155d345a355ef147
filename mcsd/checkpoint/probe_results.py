"""The context probe's result files (``mcsd-probe context``), owned here alone:
``context_curve.csv`` (the loss by position) and ``context_delta.csv`` (Delta_N with its
swapped-past control), each row tagged with the probed model's identity; their writer and reader;
and ``context_losses.safetensors``, the losses of the documents read so far (written after every
batch), which ``resume=true`` goes on from.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from mcsd.errors import MCSDError

CURVE_FILE, DELTA_FILE, LOSSES_FILE = "context_curve.csv", "context_delta.csv", "context_losses.safetensors"
RESULT_FILES = (CURVE_FILE, DELTA_FILE, LOSSES_FILE)  # what a probe writes into its output_dir


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


def documents_digest(documents: torch.Tensor) -> str:
    """The SHA-256 of the probe's token ids: a resumed probe reads the same documents."""
    return hashlib.sha256(documents.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()


def write_losses(output_dir: Path, losses: dict[str, torch.Tensor], settings: dict[str, Any]) -> Path:
    """Write the losses read so far (:class:`mcsd.probes.context.ContextLosses`' tensors by name)
    with the ``settings`` that made them (JSON-able: the model, form, windows, positions,
    :func:`documents_digest`), replacing the earlier file whole."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path, partial = output_dir / LOSSES_FILE, output_dir / f".{LOSSES_FILE}.partial"
    save_file({name: tensor.contiguous() for name, tensor in losses.items()}, str(partial),
              metadata={"settings": json.dumps(settings)})
    os.replace(partial, path)
    return path


def resumed_losses(output_dir: Path, settings: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """``resume=true``: the losses an earlier probe in ``output_dir`` read (``None`` where it holds
    no probe), refused in one line where they were read with other ``settings`` (their numbers
    would not stand beside the new ones) or where only the tables are there."""
    path = output_dir / LOSSES_FILE
    if not path.is_file():
        if (output_dir / DELTA_FILE).is_file():
            raise MCSDError(f"resume=true: {output_dir} holds a probe's tables but not its {LOSSES_FILE}, which "
                            "resume=true goes on from: give another output_dir, or overwrite=true to probe again")
        return None
    with safe_open(str(path), "pt") as file:
        earlier = json.loads((file.metadata() or {}).get("settings", "{}"))
    for key, value in settings.items():
        if earlier.get(key) != value:
            shown = "other documents" if key == "documents" else f"{key}={earlier.get(key)!r}"
            mine = "these documents" if key == "documents" else f"{key}={value!r}"
            raise MCSDError(f"resume=true: the probe in {output_dir} was read with {shown} and this run has "
                            f"{mine}: resume with the same settings, or give another output_dir")
    return load_file(str(path))
