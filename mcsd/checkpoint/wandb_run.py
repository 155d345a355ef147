"""A W&B run read back from its own file (``run-<id>.wandb``), offline runs included, through W&B's
record schema (``wandb.proto.wandb_internal_pb2.Record``).

The file is what W&B's service writes and ``wandb sync`` uploads: a 7-byte header (``:W&B``, the
magic ``0xBEE1``, version 0), then LevelDB's log format (blocks of 32 KiB; each chunk a 7-byte
header: CRC-32C, length, type FULL/FIRST/MIDDLE/LAST), each whole record a serialised ``Record``.
That framing is W&B's datastore format since 0.10 (written by its Go core since 0.19, which no
longer ships a Python reader); what this module reads of the records is the run's identity
(``run``), its config and summary updates, its history rows, its artifacts and its exit code.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

from mcsd.errors import MCSDError

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32768
CHUNK_HEADER = struct.Struct("<IHB")  # masked CRC-32C, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class WandbFileError(MCSDError):
    """A file that is not a W&B run file (or one cut short in its header)."""


@dataclasses.dataclass
class WandbRun:
    """What one W&B run file holds: identity, the config and summary as they stand at its end,
    every history row in order, the exit code (``None`` for a run that never finished) and the
    artifacts it logged."""

    path: Path
    id: str
    name: str
    group: str
    job_type: str
    tags: list[str]
    config: dict[str, Any]
    summary: dict[str, Any]
    history: list[dict[str, Any]]
    exit_code: int | None
    artifacts: list[LoggedArtifact] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class LoggedArtifact:
    """An artifact the run logged: its name, type, aliases, metadata and the paths of its files."""

    name: str
    type: str
    aliases: list[str]
    metadata: dict[str, Any]
    files: list[str]


def records(path: Path) -> list[bytes]:
    """The serialised records of a W&B run file, in order (a last record cut short by a crash is left out)."""
    data = Path(path).read_bytes()
    if not data.startswith(HEADER):
        raise WandbFileError(f"{path} is not a W&B run file (no ':W&B' header): pass a run-<id>.wandb file or a "
                             "folder holding some")
    whole, pending, position = [], b"", len(HEADER)
    while position + CHUNK_HEADER.size <= len(data):
        left = BLOCK - position % BLOCK
        if left < CHUNK_HEADER.size:  # the block's tail is padding
            position += left
            continue
        _, length, kind = CHUNK_HEADER.unpack_from(data, position)
        position += CHUNK_HEADER.size
        if kind == 0 and length == 0:  # zero-filled rest of a block
            position += left - CHUNK_HEADER.size
            continue
        pending += data[position:position + length]
        position += length
        if kind in (FULL, LAST):
            whole.append(pending)
            pending = b""
    return whole


def _key(item: Any) -> str:
    """An update's key: ``key``, or its ``nested_key`` parts joined by dots."""
    return item.key or ".".join(item.nested_key)


def _apply(target: dict[str, Any], record: Any) -> None:
    """A config or summary record's updates and removals, applied to ``target``."""
    for item in record.update:
        target[_key(item)] = json.loads(item.value_json)
    for item in record.remove:
        target.pop(_key(item), None)


def read_wandb_run(path: Path) -> WandbRun:
    """The run a ``run-<id>.wandb`` file holds (one line naming the file when it is not one)."""
    from wandb.proto import wandb_internal_pb2

    run = WandbRun(Path(path), "", "", "", "", [], {}, {}, [], None)
    for raw in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            identity = record.run
            run.id, run.name, run.group, run.job_type = (identity.run_id, identity.display_name, identity.run_group,
                                                         identity.job_type)
            run.tags = list(identity.tags)
            _apply(run.config, identity.config)
        elif kind == "config":
            _apply(run.config, record.config)
        elif kind == "summary":
            _apply(run.summary, record.summary)
        elif kind == "history":
            run.history.append({_key(item): json.loads(item.value_json) for item in record.history.item})
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
        elif kind == "artifact":
            logged = record.artifact
            run.artifacts.append(LoggedArtifact(logged.name, logged.type, list(logged.aliases),
                                                json.loads(logged.metadata or "{}"),
                                                sorted(entry.path for entry in logged.manifest.contents)))
    return run


def find_wandb_runs(folder: Path) -> list[Path]:
    """Every W&B run file under ``folder`` (a run folder, a sweep folder, a ``wandb/`` folder), sorted."""
    return sorted(Path(folder).rglob("run-*.wandb"))
