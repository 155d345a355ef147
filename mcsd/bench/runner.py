"""The bench's runner: one point measured (:data:`POINTS`), in a fresh child process
where the point's peak memory must be its own, its failure (out of memory, an error) a result
of its own so that the grid goes on."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from multiprocessing.context import BaseContext
from typing import Any

import torch

from mcsd.bench import measure
from mcsd.bench.decoding import inference_point
from mcsd.bench.training_step import train_point

POINTS = {"inference": inference_point, "train": train_point}  # each mode's measurement of one point
# How an allocation failure reads, on a CPU and on a GPU (the caching allocator's OutOfMemoryError,
# or a library that allocates for itself: cuBLAS, cuDNN, cuFFT, or CUDA's own error).
OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "cannot allocate memory", "alloc_failed",
                 "failed to allocate", "std::bad_alloc")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation failure (``oom``), on a CPU or a GPU."""
    return (isinstance(error, (MemoryError, torch.OutOfMemoryError))
            or any(text in str(error).lower() for text in OUT_OF_MEMORY))


def measure_point(kind: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One point's measurement (:data:`POINTS`) with its ``status``: ``ok``; ``oom`` (an
    allocation failure); or ``error``, with its one-line ``reason``, so that the grid goes on. The
    point's memory is freed before it returns: outside the ``except``, whose traceback holds the
    point's tensors (its frames' locals), then the garbage collector and the GPU's cache. The
    collector scans the point's own objects alone: what existed before the point (torch's and the
    caller's millions of objects, 0.3 s a full collection in mcsd-bench, more in a test process)
    is frozen while it runs (:func:`gc.freeze`)."""
    gc.freeze()
    try:
        try:
            result = {**POINTS[kind](**arguments), "status": "ok"}
        except Exception as error:  # noqa: BLE001  a point's failure is a result: the grid goes on
            lines = str(error).strip().splitlines()
            reason = f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
            result = {"status": "oom" if is_out_of_memory(error) else "error", "reason": reason}
        if arguments.get("compile"):
            torch._dynamo.reset()  # the point's compiled graphs go with its model
        gc.collect()
    finally:
        gc.unfreeze()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def point_processes() -> BaseContext:
    """Where isolated points start: processes forked from a fork server that has imported this
    module (torch, the models) once, so that a point starts at once instead of paying an
    interpreter's start and its imports (seconds each); every point still gets a process of its
    own, forked from one that has never measured anything (its peak memory is its own)."""
    context = get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


@contextlib.contextmanager
def parents_import_path() -> Iterator[None]:
    """While the fork server starts: it imports from this process's ``sys.path``, not from its
    working directory. Python 3.11's fork server ignores the path it is sent and puts its working
    directory first, so a checkout there (a before/after run's other side, on ``PYTHONPATH`` here)
    would have its points measure that checkout's code instead of this process's."""
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "PYTHONSAFEPATH")}
    os.environ["PYTHONPATH"] = os.pathsep.join(entry for entry in sys.path if entry)
    os.environ["PYTHONSAFEPATH"] = "1"  # no working directory first on its path
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _in_child(kind: str, arguments: dict[str, Any], memory_limit_mb: float | None,
              threads: int | None) -> dict[str, Any]:
    """Run one point in this (fresh) process, which leaves Ctrl-C to mcsd-bench."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if threads:
        torch.set_num_threads(threads)
    measure.limit_extra_memory(memory_limit_mb)
    return measure_point(kind, arguments)


def run_point(kind: str, arguments: dict[str, Any], isolate: bool, memory_limit_mb: float | None,
              threads: int | None = None) -> dict[str, Any]:
    """One point, in a fresh process when ``isolate`` (a process killed for memory is OOM too),
    on ``threads`` torch threads (``None``: torch's default; set in this process when not isolated)."""
    if not isolate:
        if threads:
            torch.set_num_threads(threads)
        return measure_point(kind, arguments)
    pool = ProcessPoolExecutor(max_workers=1, mp_context=point_processes())
    # The point's process ignores Ctrl-C (a terminal sends it to the whole process group): it is
    # started with SIGINT ignored (the fork server, started here the first time, keeps ignoring it
    # for the processes it forks). A second Ctrl-C in mcsd-bench kills it.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with parents_import_path():  # the fork server starts with the first submission
            started = pool.submit(os.getpid)
    finally:
        signal.signal(signal.SIGINT, previous)
    with pool:
        try:
            return pool.submit(_in_child, kind, arguments, memory_limit_mb, threads).result()
        except BrokenProcessPool:
            return {"status": "oom", "reason": "the point's process was killed (out of memory)"}
        except KeyboardInterrupt:
            if started.done():
                os.kill(started.result(), signal.SIGKILL)
            raise
