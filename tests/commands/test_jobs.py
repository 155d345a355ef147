"""The loop the measuring commands share (mcsd/jobs.py): what it runs, where its bar stands, and
what stops it (a command's limit before a job, Ctrl-C after the job under way, a second Ctrl-C at
once)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from tqdm.auto import tqdm

from mcsd import jobs
from mcsd.jobs import CTRL_C, run_jobs


@pytest.fixture
def bars(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tqdm]]:
    """Every bar the loop draws, kept to read after it ends."""
    made: list[tqdm] = []

    class Recorded(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(jobs, "tqdm", Recorded)
    yield made
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a loop Ctrl-C stopped leaves it to the app


def test_every_job_runs_in_order_and_the_bar_ends_full_from_the_work_done_before(bars: list[tqdm]) -> None:
    """The bar starts at the earlier run's work and moves by each job's share, whatever the job
    moved it by itself (job 2 moves it part of the way, job 3 past its share)."""
    ran, seen = [], []

    def run(job: int, bar: tqdm) -> None:
        seen.append(bar.n)
        ran.append(job)
        bar.update({1: 0, 2: 5, 3: 40}[job])

    outcome = run_jobs([1, 2, 3], run, desc="test", each="job", unit="token", work=lambda job: 10 * job, done=7)
    (bar,) = bars
    assert ran == outcome.finished == [1, 2, 3] and outcome.stopped_by is None
    assert seen == [7, 17, 37] and bar.total == bar.n == 67


def test_a_limit_stops_before_the_job_it_refuses(bars: list[tqdm]) -> None:
    ran = []
    outcome = run_jobs([1, 2, 3], lambda job, bar: ran.append(job), desc="test", each="job", unit="job",
                       may_start=lambda job: "time_budget_s=1" if job == 3 else None)
    assert ran == outcome.finished == [1, 2] and outcome.stopped_by == "time_budget_s=1"


def test_ctrl_c_stops_after_the_job_under_way_and_a_second_at_once(bars: list[tqdm]) -> None:
    """One Ctrl-C during job 2: it finishes, job 3 never starts, and the bar says it is stopping.
    Two during job 2: it is dropped where it stood (not finished)."""
    ran = []

    def run(job: int, bar: tqdm, signals: int) -> None:
        for _ in range(signals if job == 2 else 0):
            os.kill(os.getpid(), signal.SIGINT)  # arrives while the job runs, as a Ctrl-C would
        ran.append(job)

    once = run_jobs([1, 2, 3], lambda job, bar: run(job, bar, 1), desc="test", each="job", unit="job")
    assert ran == once.finished == [1, 2] and once.stopped_by == CTRL_C
    assert bars[0].desc.rstrip(": ") == "test (Ctrl-C: stopping after this job)"
    ran.clear()
    twice = run_jobs([1, 2, 3], lambda job, bar: run(job, bar, 2), desc="test", each="job", unit="job")
    assert ran == twice.finished == [1] and twice.stopped_by == CTRL_C
    assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # ignored while the app writes
