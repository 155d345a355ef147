"""A package front whose names load on first use (PEP 562), so that importing one module of the
package (a command, a reader) does not import everything the front offers."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_names(package: str, homes: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name of ``homes`` is imported from its
    module (``homes[name]``) when first read, then kept in the package's namespace."""
    namespace = vars(importlib.import_module(package))

    def __getattr__(name: str) -> object:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
