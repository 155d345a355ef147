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
