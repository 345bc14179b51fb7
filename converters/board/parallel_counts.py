"""Counts side by side: one emulated count per usable core, with progress and the time left.

A count (:mod:`.emulate`) is one ``qemu-user`` process on one core for seconds to minutes, and a
conversion makes several variants: counted one after another they took most of a large model's
conversion. :class:`CountPool` runs them on ``workers`` threads (each only waits on its qemu
child, so threads suffice), by default one per core this process may use. Its threads are
daemons: a conversion that fails half-way leaves no thread that keeps the interpreter from
exiting, and :mod:`.guest_process` kills the guests still running when it exits.

The time left (:func:`time_left`) is an estimate from the counts finished so far, and is said to
be one.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

from edgesdk.errors import EmulatorError
from edgesdk.runtime.scheduling import usable_cpus

__all__ = ["CountPool", "time_left", "progress_line"]

#: progress(stage, done, total), as the converter's own progress callback.
Progress = Callable[[str, int, int], None]
#: How often wait_all says the time left again while no count finishes (a display refresh only).
_REFRESH_S = 30.0


@dataclass
class _Job:
    label: str
    work: Callable[[], Any]
    future: Future[Any] = field(default_factory=Future)
    started: float | None = None
    finished: float | None = None


class CountPool:
    """Runs labelled counts on ``workers`` daemon threads (default: one per usable core), in
    submission order. ``clock`` (seconds, monotonic) times them for the estimate of the time left.
    """

    def __init__(self, workers: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if workers is not None and workers < 1:
            raise EmulatorError(f"workers={workers}: counts need at least one worker; leave it "
                                "None for one per usable core")
        self.workers = workers or max(1, len(usable_cpus()))
        self.clock = clock
        self._jobs: dict[str, _Job] = {}
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def submit(self, label: str, work: Callable[[], Any]) -> None:
        """Start ``work()`` for ``label`` when a worker is free; returns at once. Once per label."""
        if label in self._jobs:
            return
        job = self._jobs[label] = _Job(label, work)
        if len(self._threads) < self.workers:
            name = f"edgesdk-count-{len(self._threads)}"
            thread = threading.Thread(target=self._serve, name=name, daemon=True)
            self._threads.append(thread)
            thread.start()
        self._queue.put(job)

    def __contains__(self, label: str) -> bool:
        return label in self._jobs

    def labels(self) -> list[str]:
        """Every label submitted, in submission order."""
        return list(self._jobs)

    def result(self, label: str) -> Any:
        """Wait for ``label``'s count; its result, or the exception its work raised."""
        return self._jobs[label].future.result()

    def close(self) -> None:
        """Let the worker threads end once the counts queued so far are done (a later submit starts
        new ones)."""
        for _ in self._threads:
            self._queue.put(None)
        self._threads = []

    def stop(self, kill: Callable[[], object]) -> None:
        """Drop the counts not started yet and end the running ones with ``kill()`` (which kills
        their guests); returns once none runs. ``kill`` is called again while one still runs (it may
        have started its guest just after the previous call)."""
        for job in self._jobs.values():
            job.future.cancel()
        while running := [job.future for job in self._jobs.values() if not job.future.done()]:
            kill()
            wait(running, timeout=1.0)

    def wait_all(self, progress: Progress | None = None) -> None:
        """Wait for every count submitted, saying after each how many are done and the time left."""
        futures = [job.future for job in self._jobs.values()]
        while True:
            done = sum(f.done() for f in futures)
            if progress is not None:
                progress(self.progress_line(), done, len(futures))
            pending = [f for f in futures if not f.done()]
            if not pending:
                return
            wait(pending, timeout=_REFRESH_S, return_when=FIRST_COMPLETED)

    def progress_line(self) -> str:
        """``counting on the board's emulated cores (2 at a time): 3/7 variants, about 4 min left
        (estimated from the counts done)``."""
        now = self.clock()
        jobs = list(self._jobs.values())
        finished = [j.finished - j.started for j in jobs
                    if j.finished is not None and j.started is not None]
        running = [now - j.started for j in jobs if j.started is not None and j.finished is None]
        queued = sum(1 for j in jobs if j.started is None and not j.future.done())
        done = sum(1 for j in jobs if j.future.done())
        left = time_left(finished, running, queued, self.workers)
        return progress_line(done, len(jobs), left, self.workers)

    def _serve(self) -> None:
        while (job := self._queue.get()) is not None:
            if not job.future.set_running_or_notify_cancel():
                continue
            job.started = self.clock()
            try:
                result = job.work()
            except BaseException as exc:  # handed to whoever waits for this count
                job.finished = self.clock()
                job.future.set_exception(exc)
            else:
                job.finished = self.clock()
                job.future.set_result(result)


def time_left(finished: Sequence[float], running: Sequence[float], queued: int,
              workers: int) -> float | None:
    """Seconds until every count is done, estimated: each count not finished takes the mean of the
    ``finished`` ones' seconds (less what a ``running`` one has already run), shared over the
    workers that have work. None before any count has finished (no basis for an estimate)."""
    if not finished:
        return None if running or queued else 0.0
    mean = sum(finished) / len(finished)
    work = sum(max(mean - elapsed, 0.0) for elapsed in running) + queued * mean
    lanes = max(1, min(workers, len(running) + queued))
    return work / lanes


def progress_line(done: int, total: int, left: float | None, workers: int) -> str:
    """What the converter shows while counts run; the time left is labelled an estimate."""
    head = f"counting on the board's emulated cores ({workers} at a time): {done}/{total} variants"
    if done == total:
        return head
    if left is None:
        return f"{head}, time left not known until a count finishes"
    amount = f"{left / 60:.0f} min" if left >= 90 else f"{max(left, 1):.0f} s"
    return f"{head}, about {amount} left (estimated from the counts done)"
