"""The documentation speaks only of what a clone has."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
# A relative path that climbs (../x), or the absolute folder the project's own machine keeps beside it.
CLIMBING = re.compile(r"(?<![\w/.$}])((?:\.\./)+[\w.\-/]*|/work/shared[\w.\-/]*)")


def _documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "experiments").glob("*/README.md")),
            *sorted((ROOT / "notebooks").glob("*.ipynb")), *sorted((ROOT / "experiments").rglob("run.sh"))]


def test_no_document_points_outside_the_repository() -> None:
    """Every path in the README, the experiments' READMEs and scripts and the notebook lies
    inside the repository, read from the document's folder or from the repository's root (where
    the commands run): nothing sends a user to files a clone does not have."""
    assert len(_documents()) > 20
    outside = []
    for document in _documents():
        for match in CLIMBING.finditer(document.read_text()):
            path = match.group(1)
            readings = [] if path.startswith("/") else [(document.parent / path).resolve(), (ROOT / path).resolve()]
            if not any(reading.is_relative_to(ROOT.resolve()) for reading in readings):
                outside.append(f"{document.relative_to(ROOT)}: {path}")
    assert outside == []


def test_the_readme_lists_every_option_of_every_config_group() -> None:
    """The README's table of mcsd-train's config groups names each group's every option (a
    config added under conf/ that the table lacks fails here, before a user misses it)."""
    readme = (ROOT / "README.md").read_text()
    table = readme.split("### Config groups of `mcsd-train`", 1)[1].split("\n\n", 2)[1]
    rows = {line.split("|")[1].strip().strip("`"): line.split("|")[2] for line in table.splitlines()[2:]}
    missing = []
    for group in ("model", "size", "ablation", "data", "trainer", "logger", "callbacks", "paths", "experiment",
                  "debug"):
        for option in sorted((ROOT / "conf" / group).glob("*.yaml")):
            if not option.stem.startswith("_") and f"`{option.stem}`" not in rows[group]:
                missing.append(f"{group}={option.stem}")
    assert missing == []
