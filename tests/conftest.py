"""pytest's hooks and fixtures for every test (the helpers the tests share are modules of
``tests/helpers/``)."""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._inductor.config

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
    # Bytecode for the suite's processes, where the environment says not to write it (this machine and
    # CI's set PYTHONDONTWRITEBYTECODE=1, and the install byte-compiles nothing: pip --no-compile): the
    # workers and the ~100 commands the tests start would each compile every module they import,
    # Lightning's and torch's included (a fresh `import lightning.pytorch, mcsd.training.run` 24-29 s
    # without, 16-17 s with: docs/layout.md). The first import writes it, the rest read it.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    # Inductor's C++ without vectorisation, here and in every process a test starts: the same functions,
    # a fifth less of a cold compile (its tiling analysis of symbolic lengths), and CI always compiles
    # cold (issue 64, docs/layout.md). A GPU compiles through Triton, untouched (tests/gpu).
    os.environ["TORCHINDUCTOR_VEC_ISA_OK"] = "0"
    torch._inductor.config.cpp.vec_isa_ok = False
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
def _compile_without_inductor(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a test, ``torch.compile`` goes through dynamo and AOTAutograd alone (``backend="aot_eager"``
    for inductor; inductor's ``mode`` and ``options`` dropped; another backend asked for is kept):
    what a model's code can break (graph breaks, guards, recompiles, mutation of its states) is traced
    as inductor would receive it, without inductor's C++ code generation, which on CI's cold cache
    cost ~10 s to ~2 minutes per architecture and test (a GPU compiles through Triton instead:
    tests/gpu). Tests whose subject is inductor's own work (its kernels, its partitioner, a bug of
    its graphs, compiled CPU decoding and training end to end) are marked ``inductor`` and compile
    as a user's process does; so do the GPU tests (Triton's code) and the processes a test starts."""
    if request.node.get_closest_marker("inductor") or request.node.get_closest_marker("gpu"):
        return
    compile_with = torch.compile

    def compile(model=None, *, backend="inductor", mode=None, options=None, **kwargs):  # noqa: ANN001,ANN202
        if backend != "inductor":
            return compile_with(model, backend=backend, mode=mode, options=options, **kwargs)
        return compile_with(model, backend="aot_eager", **kwargs)

    monkeypatch.setattr(torch, "compile", compile)


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
