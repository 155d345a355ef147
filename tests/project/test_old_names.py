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
    **{line.split()[0]: line.split()[1] for line in """
        mcsd.cli mcsd.commands.app
        mcsd.train mcsd.commands.train
        mcsd.generate mcsd.commands.generate
        mcsd.export mcsd.commands.export
        mcsd.prepare mcsd.commands.prepare
        mcsd.bench.run mcsd.commands.bench
        mcsd.evaluation.run mcsd.commands.evaluate
        mcsd.probes.run mcsd.commands.probe
        mcsd.plots.cli mcsd.commands.plot
        mcsd.data.download mcsd.commands.download
    """.split("\n") if line.strip()},
}


@pytest.mark.parametrize("old", OLD_MODULES)
def test_an_old_module_name_warns_and_gives_the_new_objects(old: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} is renamed {OLD_MODULES[old]}.*mcsd 0\.2\.0"):
        module = importlib.import_module(old)
    new = importlib.import_module(OLD_MODULES[old])
    if hasattr(module, "__all__") and module is not new:  # a module of its own re-exporting the new one's names
        assert all(getattr(module, name) is getattr(new, name) for name in module.__all__)
    else:  # the old name is the new module itself
        assert module is new


def test_the_docs_list_every_old_name_and_when_it_goes() -> None:
    layout = (ROOT / "docs" / "layout.md").read_text()
    section = layout[layout.index("## Old names"):]
    for old, new in OLD_MODULES.items():
        assert f"| `{old}` | `{new}` | 0.2.0 |" in section


def test_an_architecture_registered_with_a_colour_warns_that_it_is_no_longer_read() -> None:
    import dataclasses

    from mcsd.models import registry
    from mcsd.plots.style import architecture_color

    with pytest.warns(DeprecationWarning, match="color= is no longer read .*mcsd 0.2.0"):
        dataclasses.replace(registry.get("mcsd"), color="tab:pink")
    assert architecture_color("mcsd") == "tab:blue"
