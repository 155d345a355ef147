"""The loop that the measuring commands share (``mcsd-bench``'s points, ``mcsd-eval``'s tasks,
``mcsd-probe``'s batches of documents): the jobs an earlier run left undone, one after another
under a progress bar, each one's results written by the command as it finishes; Ctrl-C stops
after the job under way (again: at once) and a command's own limit (the bench's time budget)
stops before a job would start. What is finished is on disk when the loop returns, so that
``resume=true`` goes on with the rest (:func:`mcsd.files.replace_earlier_results` keeps it).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from tqdm.auto import tqdm

Job = TypeVar("Job")
CTRL_C = "Ctrl-C"  # JobsOutcome.stopped_by of a loop that Ctrl-C stopped


class StopAfterCurrent:
    """Ctrl-C during a loop over jobs: the first asks it to stop after the one under way (the
    loop reads ``requested``; ``on_request`` may say so on its progress bar), the second stops
    at once (KeyboardInterrupt, the one under way dropped). Once stopped, further Ctrl-Cs are
    ignored while what was finished is written (:func:`mcsd.runtime.interrupted` ends the app). A
    terminal sends Ctrl-C to the whole process group, child processes included."""

    def __init__(self, on_request: Callable[[], object] | None = None) -> None:
        self.requested = False
        self.on_request = on_request
        self._looping = False

    def _handle(self, signum: int, frame: object) -> None:
        if not self._looping:
            return  # stopped: what was finished is being written
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.on_request is not None:
            self.on_request()

    def __enter__(self) -> StopAfterCurrent:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        self._looping = True
        return self

    def __exit__(self, *exception: object) -> bool:
        self._looping = False
        if exception[0] is KeyboardInterrupt:  # the second Ctrl-C: the loop ends, what it finished is kept
            self.requested = True
        if not self.requested:
            signal.signal(signal.SIGINT, self._previous)
        return exception[0] is KeyboardInterrupt


@dataclass(frozen=True)
class JobsOutcome(Generic[Job]):
    """How a loop ended: the jobs it finished (in order) and what stopped it before the last
    (:data:`CTRL_C`, the reason ``may_start`` gave, or ``None``: every job finished)."""

    finished: list[Job]
    stopped_by: str | None


def run_jobs(jobs: Sequence[Job], run: Callable[[Job, tqdm], object], *, desc: str, each: str, unit: str,
             work: Callable[[Job], float] = lambda job: 1, done: float = 0,
             may_start: Callable[[Job], str | None] | None = None,
             postfix: Callable[[Job], str] | None = None) -> JobsOutcome[Job]:
    """Run ``jobs`` one after another: ``run(job, bar)`` does one (and writes its results; it may
    move the bar itself within the job). The bar counts ``work(job)`` per job in ``unit`` (1 each
    by default), starting at ``done`` (the work an earlier run finished) and ending each job at
    its share, whatever ``run`` moved it by. ``may_start(job)``: ``None`` to start it, else the
    reason the loop stops before it; ``postfix(job)``: the job's name on the bar while it runs;
    ``each``: what a job is, in words (``point``: Ctrl-C says it stops after this point)."""
    finished: list[Job] = []
    stopped_by = None
    bar = tqdm(total=done + sum(work(job) for job in jobs), initial=done, desc=desc, unit=unit,
               unit_scale=unit == "token")
    with bar, StopAfterCurrent(lambda: bar.set_description(f"{desc} (Ctrl-C: stopping after this {each})")) as stop:
        for job in jobs:
            reason = may_start(job) if may_start is not None else None
            if reason is not None:
                stopped_by = reason
                break
            if postfix is not None:
                bar.set_postfix_str(postfix(job))
            before = bar.n
            run(job, bar)
            bar.update(before + work(job) - bar.n)
            finished.append(job)
            if stop.requested:
                break
    if stop.requested:
        stopped_by = CTRL_C
    return JobsOutcome(finished, stopped_by)
