"""The suite's own order (tests/conftest.py): test files run longest first by
tests/file_seconds.json, so the two CI workers end together."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

import conftest

TESTS = Path(conftest.__file__).parent


@dataclass
class Item:
    nodeid: str


def test_every_timed_file_is_a_test_file_of_the_suite() -> None:
    seconds = json.loads(conftest.FILE_SECONDS.read_text())
    assert all(value >= 0 for value in seconds.values())
    stale = [path for path in seconds if not (TESTS.parent / path).is_file()]
    assert stale == [], f"{stale}: gone from tests/; refresh with python -m pytest --record-file-seconds"


def test_files_are_ordered_longest_first_keeping_each_files_tests_together(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    timed = tmp_path / "file_seconds.json"
    timed.write_text(json.dumps({"tests/a.py": 5.0, "tests/b.py": 50.0, "tests/c.py": 0.5}))
    monkeypatch.setattr(conftest, "FILE_SECONDS", timed)
    items = [Item(nodeid) for nodeid in ("tests/a.py::one", "tests/a.py::two", "tests/b.py::one", "tests/c.py::one",
                                         "tests/new.py::one", "tests/b.py::two", "tests/new.py::two")]
    conftest.pytest_collection_modifyitems(items)
    assert [item.nodeid for item in items] == [
        "tests/new.py::one", "tests/new.py::two",  # not timed yet: first, so that it cannot end the run
        "tests/b.py::one", "tests/b.py::two", "tests/a.py::one", "tests/a.py::two", "tests/c.py::one"]


def test_a_run_records_the_seconds_of_the_files_it_ran_and_keeps_the_others(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    timed = tmp_path / "file_seconds.json"
    timed.write_text(json.dumps({"tests/a.py": 5.0, "tests/b.py": 50.0}))
    monkeypatch.setattr(conftest, "FILE_SECONDS", timed)
    recorder = conftest._FileSecondsRecorder()

    @dataclass
    class Report:
        nodeid: str
        duration: float

    for nodeid, duration in (("tests/b.py::one", 1.0), ("tests/b.py::one", 2.5), ("tests/c.py::one", 0.5)):
        recorder.pytest_runtest_logreport(Report(nodeid, duration))
    recorder.pytest_sessionfinish()
    assert json.loads(timed.read_text()) == {"tests/a.py": 5.0, "tests/b.py": 3.5, "tests/c.py": 0.5}
