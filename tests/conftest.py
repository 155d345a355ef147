"""pytest's hooks and fixtures for every test (the helpers the tests share are modules of
``tests/helpers/``)."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

FILE_SECONDS = Path(__file__).with_name("file_seconds.json")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-file-seconds", action="store_true",
                     help=f"write how long each test file took (setup, calls, teardown) into {FILE_SECONDS.name}, "
                          "keeping the files this run did not reach")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, split the cores between the workers (torch and the CLIs the tests
    start would otherwise each take every core and slow each other down); benchmarks measure on
    the shared machine."""
    # The benchmarks measure anyway where the suite's other worker shares the cores (no test reads a
    # time as the machine's); tests/bench/test_bench.py checks the refusal itself.
    os.environ["MCSD_BUSY_MACHINE"] = "measure"
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
    if config.getoption("record_file_seconds") and not hasattr(config, "workerinput"):  # the controller, or no xdist
        config.pluginmanager.register(_FileSecondsRecorder(), "file_seconds_recorder")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest test files first (tests/file_seconds.json), a file keeping its tests together and
    in order. Under ``--dist loadfile`` (with ``--no-loadscope-reorder``) a worker takes the next
    file as it finishes one, so the long ones start early and the run ends on short ones, with both
    workers busy to the end. A file not in the list goes first: a new long file never ends the run."""
    seconds = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.is_file() else {}
    unknown = float("inf")
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], unknown))  # stable: order within a file


class _FileSecondsRecorder:
    """Sums every phase of every test by file and merges the sums into tests/file_seconds.json."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::")[0]] += report.duration

    def pytest_sessionfinish(self) -> None:
        recorded = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.is_file() else {}
        recorded.update({path: round(value, 1) for path, value in self.seconds.items()})
        FILE_SECONDS.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_inherited_wandb_service() -> Iterator[None]:
    """A W&B run made in this process (a command run through its entry point here) leaves its
    service's address in ``os.environ`` (``WANDB_SERVICE``); every process a later test starts
    would inherit it and connect to that service, which may have ended by then ("Failed to
    connect to service on socket"). Each test's processes start their own, as a user's would."""
    yield
    os.environ.pop("WANDB_SERVICE", None)
