"""Sharded weights and sharded checkpoints, for code that must take whole and sharded models
alike: the final model folder, ``init_from``, loading a sharded (DCP) checkpoint on one process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor

from mcsd.errors import MCSDError


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are DTensors (sharded by FSDP2)."""
    return any(isinstance(parameter, DTensor) for parameter in model.parameters())


@torch.no_grad()
def copy_into(parameter: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a full tensor into ``parameter``: the whole of it, or this process's shard of it
    (cut locally, as FSDP2 cuts: no communication)."""
    full = full.to(dtype=parameter.dtype)
    if isinstance(parameter, DTensor):
        full = distribute_tensor(full.to(parameter.device), parameter.device_mesh, parameter.placements,
                                 src_data_rank=None)
    parameter.copy_(full)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full weights of ``model`` on the CPU: gathered from every process when it is sharded
    (a collective: every process calls it; the others get an empty dict), else its own."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


# A sharded checkpoint is a torch.distributed.checkpoint (DCP) folder, as Lightning's
# ModelParallelStrategy writes it: the tensors (``state_dict``, ``optimizer_0``, ...) in one
# ``__<rank>_0.distcp`` file per process, indexed by ``.metadata``, and everything else of the
# checkpoint (loop states, hyperparameters, the tokenizer, ...) in ``meta.pt``.
SHARDED_INDEX = ".metadata"
SHARDED_METADATA = "meta.pt"


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether ``path`` is (or was meant to be) a sharded checkpoint folder."""
    return path.is_dir() and ((path / SHARDED_INDEX).exists() or (path / SHARDED_METADATA).exists()
                              or any(path.glob("*.distcp")))


def check_sharded_checkpoint(path: Path) -> None:
    """Refuse, in one line, a sharded checkpoint that is not whole: its index or metadata
    missing, a process's file missing or shorter than the index says."""
    fix = "use another checkpoint of the run"
    for name in (SHARDED_INDEX, SHARDED_METADATA):
        if not (path / name).is_file():
            raise MCSDError(f"{path} is not a whole sharded checkpoint ({name} is missing): {fix}")
    try:
        index = FileSystemReader(str(path)).read_metadata()
    except Exception as error:  # a truncated or corrupt index: whatever unpickling it raised
        raise MCSDError(f"{path} is not a whole sharded checkpoint ({SHARDED_INDEX} is unreadable: "
                        f"{type(error).__name__}): {fix}") from None
    needed: dict[str, int] = {}
    for item in index.storage_data.values():
        needed[item.relative_path] = max(needed.get(item.relative_path, 0), item.offset + item.length)
    for name, size in sorted(needed.items()):
        file = path / name
        if not file.is_file():
            raise MCSDError(f"{path} is not a whole sharded checkpoint ({name} is missing): {fix}")
        if file.stat().st_size < size:
            raise MCSDError(f"{path} is not a whole sharded checkpoint ({name} is truncated: {file.stat().st_size:,} "
                            f"of {size:,} bytes): {fix}")


def read_sharded(path: Path, keys: set[str] | None = None) -> dict[str, Any]:
    """The tensors of a sharded checkpoint (those under ``keys``, or all), whole, in this process
    (no process group needed): a sharded run's weights on one process. (As torch's own
    ``dcp_to_torch_save`` reads one, through the same private loader.)"""
    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=FileSystemReader(str(path)), planner=_EmptyStateDictLoadPlanner(keys=keys),
                     no_dist=True)
    return state


def whole_checkpoint(path: Path) -> dict[str, Any]:
    """A sharded checkpoint in the layout of a Lightning checkpoint file (full ``state_dict``,
    ``optimizer_states`` keyed by parameter index): what a single-process or DDP run resumes from."""
    check_sharded_checkpoint(path)
    checkpoint = torch.load(path / SHARDED_METADATA, map_location="cpu", weights_only=True)
    state = read_sharded(path)
    checkpoint["state_dict"] = state.pop("state_dict")
    checkpoint["optimizer_states"] = [_keyed_by_index(state[f"optimizer_{index}"]) for index in range(len(state))]
    return checkpoint


def _keyed_by_index(optimizer_state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name (``get_optimizer_state_dict``'s) keyed by
    position in the parameter groups instead (``Optimizer.state_dict``'s)."""
    position: dict[str, int] = {}
    groups = []
    for group in optimizer_state["param_groups"]:
        groups.append({**group, "params": [position.setdefault(name, len(position)) for name in group["params"]]})
    state = {position[name]: value for name, value in optimizer_state["state"].items()}
    return {"state": state, "param_groups": groups}
