"""The documentation speaks only of what a clone has: every page's links lead somewhere, its
commands exist, its paths are there, and the README's contents list every page."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from helpers import ROOT


# A relative path that climbs (../x), or the absolute folder the project's own machine keeps beside it.
CLIMBING = re.compile(r"(?<![\w/.$}])((?:\.\./)+[\w.\-/]*|/work/shared[\w.\-/]*)")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
ANCHOR = re.compile(r'<a id="([^"]+)">')
# A path of the repository named in backticks or a code block (placeholders and globs aside).
REPOSITORY_PATH = re.compile(r"(?<![\w/.\-<])((?:mcsd|conf|tests|docs|experiments|notebooks|hydra_plugins|\.ci)/"
                             r"[\w.\-/<>*{}$]*)")
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.|XXX")
COMMAND = re.compile(r"(?<![\w\-/.])(mcsd-[a-z]+)\b")


def ignored_folders() -> list[str]:
    """The folders ``.gitignore`` keeps out of a clone (downloaded corpora, logs): a page may name
    a path in one, which a user's own runs make."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return [line.strip("/") + "/" for line in lines if line.endswith("/") and "*" not in line]


def pages() -> list[Path]:
    """The README and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def documents() -> list[Path]:
    return [*pages(), *sorted((ROOT / "experiments").glob("*/README.md")),
            *sorted((ROOT / "notebooks").glob("*.ipynb")), *sorted((ROOT / "experiments").rglob("run.sh"))]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text, fenced, found = page.read_text(), False, set()
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found | set(ANCHOR.findall(text))


def test_no_document_points_outside_the_repository() -> None:
    """Every path in the pages, the experiments' READMEs and scripts and the notebook lies
    inside the repository, read from the document's folder or from the repository's root (where
    the commands run): nothing sends a user to files a clone does not have."""
    assert len(documents()) > 30
    outside = []
    for document in documents():
        for match in CLIMBING.finditer(document.read_text()):
            path = match.group(1)
            readings = [] if path.startswith("/") else [(document.parent / path).resolve(), (ROOT / path).resolve()]
            if not any(reading.is_relative_to(ROOT.resolve()) for reading in readings):
                outside.append(f"{document.relative_to(ROOT)}: {path}")
    assert outside == []


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_of_a_page_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        file, _, anchor = target.partition("#")
        destination = (page.parent / file).resolve() if file else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading or anchor {anchor!r} there")
    assert broken == []


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_path_and_command_a_page_names_exists(page: Path) -> None:
    """Repository paths (``mcsd/...``, ``conf/...``, ``experiments/...``, ...) exist, read from the
    root or the page's folder; every ``mcsd-*`` command is one of the package's console scripts;
    every ``python -m mcsd...`` module is there."""
    scripts = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
    text = page.read_text()
    missing = []
    for path in REPOSITORY_PATH.findall(text):
        path = path.rstrip(".,:;")
        if PLACEHOLDER.search(path) or any(path.startswith(folder) for folder in ignored_folders()):
            continue
        if not any((base / path).exists() for base in (ROOT, page.parent)):
            missing.append(path)
    missing += [f"command {command}" for command in set(COMMAND.findall(text)) - scripts]
    for module in re.findall(r"python -m (mcsd[\w.]*)", text):
        parts = ROOT.joinpath(*module.split("."))
        if not (parts.with_suffix(".py").is_file() or (parts / "__main__.py").is_file()):
            missing.append(f"module {module}")
    assert missing == []


def test_the_readme_lists_every_page() -> None:
    readme = (ROOT / "README.md").read_text()
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in LINK.findall(readme)}
    assert [str(page.relative_to(ROOT)) for page in pages()[1:] if page.resolve() not in linked] == []


def test_the_config_page_lists_every_option_of_every_config_group() -> None:
    """The table of mcsd-train's config groups names each group's every option (a config added
    under conf/ that the table lacks fails here, before a user misses it)."""
    text = (ROOT / "docs" / "configs.md").read_text()
    table = text.split("## Config groups of `mcsd-train`", 1)[1].split("\n\n", 2)[1]
    rows = {line.split("|")[1].strip().strip("`"): line.split("|")[2] for line in table.splitlines()[2:]}
    missing = []
    for group in ("model", "size", "ablation", "data", "trainer", "logger", "callbacks", "paths", "experiment",
                  "debug"):
        for option in sorted((ROOT / "conf" / group).glob("*.yaml")):
            if not option.stem.startswith("_") and f"`{option.stem}`" not in rows[group]:
                missing.append(f"{group}={option.stem}")
    assert missing == []
