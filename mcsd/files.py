"""The files the project writes: their permissions (those of a file made with ``open()``), and
results that a command's new run would replace.

Some writers create their file with mode 0600 (safetensors stages the weights in a temporary
file, whose mode survives its rename), which leaves a model folder that its group and others
cannot read; the project gives such files the usual mode instead.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

from mcsd.errors import MCSDError


def default_file_mode() -> int:
    """``0o666`` less this process's umask (0644 under the usual umask 022)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def give_default_permissions(*paths: Path) -> None:
    """Set every file of ``paths`` (a folder: every file below it) to :func:`default_file_mode`."""
    mode = default_file_mode()
    for path in paths:
        for file in ([path] if path.is_file() else [item for item in path.rglob("*") if item.is_file()]):
            os.chmod(file, mode)


def replace_earlier_results(folder: Path, names: list[str], command: str, overwrite: bool,
                            resume: str | None = None, resuming: bool = False) -> None:
    """Before ``command`` writes its results (the files ``names``) into ``folder`` (its
    ``output_dir``): refuse a folder that holds an earlier run's results, naming them and the
    settings that go on (``resume``: how the command keeps them, where it can) or replace them
    (``overwrite=true``, which removes them first, so that none of the old run stays beside the
    new one's). A new or empty folder, or one without those files, is left as it is; so is the
    folder of a run ``resuming`` (``resume=true``: the command goes on with what it holds), which
    ``overwrite=true`` contradicts."""
    if resuming and overwrite:
        raise MCSDError("resume=true keeps the results in output_dir and overwrite=true replaces them: give one of them")
    if resuming:
        return
    found = [name for name in names if (folder / name).exists()]
    if not found:
        return
    if not overwrite:
        keep = f"{resume}, " if resume else ""
        raise MCSDError(f"output_dir={folder} holds the results of an earlier {command} run ({', '.join(found)}): "
                        f"choose a new folder (leave output_dir out: each run gets one of its own), {keep}or "
                        "overwrite=true to replace them")
    for name in found:
        path = folder / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    logging.getLogger("mcsd").warning("overwrite=true: the earlier results in %s (%s) removed; figures drawn from them "
                                      "there are stale until drawn again", folder, ", ".join(found))


def require_readable(path: Path) -> None:
    """Raise :class:`PermissionError` (which the commands report in one line, naming the file and
    this user's rights) for a file this user may not read, before a reader would take the failure
    for a truncated or corrupt file."""
    if path.exists() and not os.access(path, os.R_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
