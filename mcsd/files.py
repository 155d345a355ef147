"""The permissions of the files the project writes: those of a file made with ``open()``.

Some writers create their file with mode 0600 (safetensors stages the weights in a temporary
file, whose mode survives its rename), which leaves a model folder that its group and others
cannot read; the project gives such files the usual mode instead.
"""

from __future__ import annotations

import os
from pathlib import Path


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
