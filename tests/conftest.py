"""pytest's hooks and fixtures for every test (the helpers the tests share are modules of
``tests/helpers/``)."""

from __future__ import annotations

import os

import pytest
import torch


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


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
