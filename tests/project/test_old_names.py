"""Each renamed module keeps its old name for one release: importing it warns (naming the new
name and the release it goes in) and gives the new module's objects, and docs/layout.md's
"Old names" table lists it with that release."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OLD_MODULES = {  # old name -> new name, removed in mcsd 0.2.0
    "mcsd.models.static_decoding": "mcsd.models.cuda_graphs",
}


@pytest.mark.parametrize("old", OLD_MODULES)
def test_an_old_module_name_warns_and_gives_the_new_objects(old: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} is renamed {OLD_MODULES[old]}.*mcsd 0\.2\.0"):
        module = importlib.import_module(old)
    new = importlib.import_module(OLD_MODULES[old])
    assert module.__all__ and all(getattr(module, name) is getattr(new, name) for name in module.__all__)


def test_the_docs_list_every_old_name_and_when_it_goes() -> None:
    layout = (ROOT / "docs" / "layout.md").read_text()
    section = layout[layout.index("## Old names"):]
    for old, new in OLD_MODULES.items():
        assert f"| `{old}` | `{new}` | 0.2.0 |" in section
