"""How many CPU cores other work takes while a benchmark runs.

A benchmark on a machine that other work shares measures that work as much as its own (on
a 2-core machine at load 2.5-6, MCSD's batch-1 decoding came out 15-80x slower than alone,
the reverse of the committed results). So ``mcsd-bench`` reads, from ``/proc/stat``, the CPU time
that every process of the machine spent over an interval, less its own and its children's
(``os.times``) and those of every live descendant (``/proc/<pid>/stat``: the compiler's worker
processes, a point's own process): what is left is other work, in cores (one fully busy core is
1). Unlike the load average it is exact for the interval and does not lag by a minute.
:func:`check_machine` is the gate a grid passes before its first point.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import statistics
import time
from typing import Any

from mcsd.errors import MCSDError

log = logging.getLogger("mcsd.bench")
SPREAD_LIMIT = 0.2
"""Repeats of a point whose times spread by more than this fraction of their median
((max - min) / median) are ``unsteady``: something else moved the times."""


@dataclasses.dataclass(frozen=True)
class CpuClock:
    """A reading: the wall clock, the CPU seconds every core spent busy since boot, and this
    process's own CPU seconds with those of its descendants, live or finished."""

    wall: float
    busy: float
    own: float


def read_clock() -> CpuClock | None:
    """The clocks now, or ``None`` where ``/proc/stat`` is not there (not Linux)."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user)
    ticks = [int(value) for value in fields[1:9]]
    busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    times = os.times()
    own = times.user + times.system + times.children_user + times.children_system
    return CpuClock(time.monotonic(), busy, own + descendants_cpu_seconds(os.getpid()))


def descendants_cpu_seconds(pid: int) -> float:
    """The CPU seconds of every live descendant of ``pid`` (with those of their own finished
    children): a process that finishes moves its time into its parent's, so a reading stays
    whole. 0 where ``/proc`` cannot be read."""
    children: dict[int, list[int]] = {}
    seconds: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return 0.0
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except (OSError, IndexError):
            continue  # gone since the listing
        parent = int(fields[1])  # fields[0] is the state; then ppid, ..., utime stime cutime cstime at 11-14
        children.setdefault(parent, []).append(int(entry))
        seconds[int(entry)] = sum(int(value) for value in fields[11:15]) / tick
    total, pending = 0.0, list(children.get(pid, []))
    while pending:
        child = pending.pop()
        total += seconds.get(child, 0.0)
        pending += children.get(child, [])
    return total


def other_cores(start: CpuClock | None, end: CpuClock | None) -> float | None:
    """The cores that other processes kept busy between two readings, on average (``None``
    without readings). The clock ticks are coarse (10 ms): over a short interval this is
    a few hundredths of a core off."""
    if start is None or end is None or end.wall <= start.wall:
        return None
    return max(0.0, ((end.busy - start.busy) - (end.own - start.own)) / (end.wall - start.wall))


def sample_other_cores(seconds: float = 1.0) -> float | None:
    """The cores other work keeps busy now: :func:`other_cores` over ``seconds`` of this process idle."""
    start = read_clock()
    time.sleep(seconds)
    return other_cores(start, read_clock())


def spread(times: list[float]) -> float:
    """``(max - min) / median`` of a point's repeated times (0 for one)."""
    median = statistics.median(times)
    return (max(times) - min(times)) / median if median > 0 else 0.0


BUSY_MACHINE = ("refuse", "wait", "measure")
BUSY_WAIT_S = 600  # busy_machine=wait waits this long at most, sampling every BUSY_POLL_S
BUSY_POLL_S = 5


def check_machine(cfg: Any) -> float | None:
    """Before the grid: the cores other work keeps busy (:func:`mcsd.bench.load.sample_other_cores`);
    above ``busy_cores``, refuse in one line (``busy_machine=refuse``), wait for the work to stop
    (``wait``, at most :data:`BUSY_WAIT_S`), or go on with a warning (``measure``)."""
    others = sample_other_cores()
    if others is None or others <= cfg.busy_cores:
        return others
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    busy = (f"other work keeps {others:.1f} of this machine's {cores} cores busy (more than busy_cores="
            f"{cfg.busy_cores}), which would slow every point by an amount nobody knows")
    if cfg.busy_machine == "measure":
        log.warning("%s: measuring anyway (busy_machine=measure); each row says what it shared (other_cores)", busy)
        return others
    if cfg.busy_machine == "wait":
        waited = 0.0
        while others is not None and others > cfg.busy_cores and waited < BUSY_WAIT_S:
            print(f"mcsd-bench: waiting for the machine: {others:.1f} cores busy with other work "
                  f"({waited:.0f} of at most {BUSY_WAIT_S} s)", flush=True)
            time.sleep(BUSY_POLL_S)
            waited += BUSY_POLL_S + 1
            others = sample_other_cores()
        if others is None or others <= cfg.busy_cores:
            return others
        busy += f" after waiting {BUSY_WAIT_S} s"
    raise MCSDError(f"{busy}: let it finish (busy_machine=wait waits for it), or busy_machine=measure to measure "
                    "anyway (each row records other_cores)")
